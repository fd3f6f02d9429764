"""Examples in docstrings run as doctests; every public name is documented."""

import doctest
import importlib
import importlib.util
import inspect
import pkgutil
from pathlib import Path

import pytest

import posenc as pe

MODULES = [
    importlib.import_module(f"posenc.{m.name}")
    for m in pkgutil.iter_modules(pe.__path__)
    if not m.name.startswith("_")
]


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_doctests(module):
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0


def test_all_public_names_exist_and_are_documented():
    for name in pe.__all__:
        obj = getattr(pe, name)
        if inspect.isfunction(obj) or inspect.isclass(obj):
            assert obj.__doc__ and obj.__doc__.strip(), f"{name} has no docstring"


def test_every_module_all_is_reexported():
    for module in MODULES:
        for name in getattr(module, "__all__", []):
            if module.__name__ not in ("posenc.viz", "posenc.exercises"):
                if name in ("train", "attention"):  # the module, callable as its function
                    assert getattr(pe, name) is importlib.import_module(f"posenc.{name}"), name
                    continue
                assert getattr(pe, name) is getattr(module, name), name


def test_top_level_all_is_exactly_the_modules_public_names():
    """posenc.__all__ lists every topic module's names once, plus the two submodules; nothing else."""
    topics = [m for m in MODULES if m.__name__ not in ("posenc.viz", "posenc.exercises")]
    expected = {name for m in topics for name in m.__all__} | {"exercises", "viz"}
    assert len(pe.__all__) == len(set(pe.__all__)), "a name is listed twice"
    assert set(pe.__all__) == expected


def test_api_reference_documents_every_module():
    """book/api.md has an automodule section for every public module (so for every name in __all__)."""
    from pathlib import Path

    api = (Path(__file__).resolve().parents[1] / "book" / "api.md").read_text()
    for module in MODULES:
        assert f".. automodule:: {module.__name__}\n" in api, module.__name__


def test_package_is_typed():
    from pathlib import Path

    assert (Path(pe.__file__).parent / "py.typed").exists()


def test_imports_go_one_way():
    """encodings -> attention -> layers -> model -> train; viz depends on nothing in the library but its renderer."""
    import ast
    from pathlib import Path

    rank = {"_validate": 0, "_costs": 0, "_checking": 0, "_evalcache": 0, "_flex": 0, "_fused_alibi": 0, "_rotation": 0, "_source": 0, "masks": 0, "runtime": 0, "data": 0, "corpora": 0, "scheme": 0,
            "passkey": 0, "ruler": 0, "recall": 0, "flipflop": 0, "even_pairs": 0, "autotune": 0, "entropy": 1, "sinusoidal": 1, "rotary": 1, "rope": 1, "rerope": 1, "extend": 1, "alibi": 1, "kerple": 1, "sandwich": 1, "t5": 1, "xpos": 1,
            "attention": 2, "sinks": 2, "linear": 2, "transnormer": 2, "decay": 2, "ssmax": 2, "cope": 2, "layers": 3, "forgetting": 3,
            "stick_breaking": 3, "_positions": 4, "_saving": 4, "_blocks": 4, "model": 4, "evaluate": 5, "sampling": 0, "train": 5, "presets": 5, "_answers": 4, "_per_sequence": 0, "exercises": 5, "evidence": 6, "spread": 0, "claims": 7, "ledger": 8, "viz": 0, "_render": 0}
    root = Path(pe.__file__).parent
    modules = {p.stem for p in root.glob("*.py")} - {"__init__"}
    assert modules == set(rank), "every module needs a place in the order"
    for name in modules:
        tree = ast.parse((root / f"{name}.py").read_text())
        imported = {node.module.split(".")[0] for node in ast.walk(tree)
                    if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module}
        imported |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                     and node.level == 1 and node.module is None for alias in node.names}
        if name in ("viz", "_render"):  # the figures: nothing of the library but viz's own rendering module
            assert imported <= ({"_render"} if name == "viz" else set()), f"{name} imports {imported}"
        for other in imported:
            assert rank[other] <= rank[name], f"{name} imports {other}: against the one-way order"


def test_modules_stay_small():
    from pathlib import Path

    for path in Path(pe.__file__).parent.glob("*.py"):
        assert len(path.read_text().splitlines()) <= 630, f"{path.name} is over ~600 lines: split it by idea"


def test_train_and_attention_are_modules_callable_as_functions():
    """``import posenc.train as m`` gives the module; ``pe.train(...)`` and ``pe.attention(...)`` still work."""
    import types

    import torch

    import posenc.attention as att_module
    import posenc.train as train_module

    assert isinstance(train_module, types.ModuleType) and train_module is pe.train
    assert isinstance(att_module, types.ModuleType) and att_module is pe.attention
    assert hasattr(train_module, "evaluate_lengths") and hasattr(att_module, "relative_attention")
    assert list(inspect.signature(pe.train).parameters)[:2] == ["model", "data"]
    q = torch.randn(1, 2, 5, 4)
    assert torch.equal(pe.attention(q, q, q), att_module.attention(q, q, q))


def test_every_reference_links_to_its_paper():
    from pathlib import Path

    from pybtex.database import parse_file

    bib = parse_file(Path(__file__).resolve().parents[1] / "book" / "references.bib")
    assert bib.entries
    missing = [
        key for key, entry in bib.entries.items()
        if not {"url", "doi", "eprint"} & {name.lower() for name in entry.fields}
    ]
    assert not missing, f"entries without url, doi or eprint: {missing}"


def _book_extension():
    """The book's Sphinx extension ``book/_ext/posenc_book.py``, imported as Sphinx imports it."""
    import sys

    folder = str(Path(__file__).resolve().parents[1] / "book" / "_ext")
    sys.path.insert(0, folder)
    try:
        import posenc_book
    finally:
        sys.path.remove(folder)
    return posenc_book


def test_bibliography_uses_the_author_year_style():
    import pybtex.plugin
    import yaml
    from pybtex.database import parse_file

    root = Path(__file__).resolve().parents[1]
    config = yaml.safe_load((root / "_config.yml").read_text(encoding="utf8"))
    assert config["sphinx"]["config"]["bibtex_default_style"] == "posenc"
    posenc_book = _book_extension()
    style_cls = pybtex.plugin.find_plugin("pybtex.style.formatting", "posenc")
    # by name: the extension may have been imported (and registered) earlier under another module name
    assert style_cls.__name__ == posenc_book.PosencStyle.__name__
    bib = parse_file(root / "book" / "references.bib")
    style = style_cls()
    entries = list(style.sort(bib.entries.values()))
    labels = dict(zip((e.key for e in entries), style.format_labels(entries)))
    assert labels["press2022alibi"] == "Press et al., 2022"
    assert labels["chiang2022overcoming"] == "Chiang and Cholak, 2022"
    assert len(set(labels.values())) == len(labels)
    html = style.format_entry(labels["press2022alibi"], bib.entries["press2022alibi"]).text.render_as("html")
    assert '<a href="https://arxiv.org/abs/2108.12409">' in html


def test_bibliography_plugin_lookups_are_scanned_once():
    import pybtex.plugin
    from pybtex.richtext import Text

    _book_extension()  # caches pybtex's plugin lookups
    lookup = pybtex.plugin.entry_points
    for group in ("pybtex.database.input", "pybtex.backends", "pybtex.style.formatting"):
        assert [ep.name for ep in lookup(group=group)] == [ep.name for ep in lookup.__wrapped__(group=group)]
    Text.from_latex("Press").render_as("text")
    before = lookup.cache_info()
    Text.from_latex("Chiang").render_as("text")  # the same plugins again: from the cache, no new scan
    after = lookup.cache_info()
    assert after.hits > before.hits and after.misses == before.misses


@pytest.mark.parametrize("name, function", [("train", "train"), ("attention", "attention")])
def test_help_on_a_callable_module_starts_with_its_function(name, function):
    """``help(pe.train)`` shows what ``pe.train(...)`` does before the module's other members."""
    import pydoc

    module = importlib.import_module(f"posenc.{name}")
    func = getattr(module, function)
    text = pydoc.render_doc(getattr(pe, name), renderer=pydoc.plaintext)
    top = "\n".join(text.splitlines()[:12])
    assert f"{name}{inspect.signature(func)}" in top.replace("\n", " ")     # the call's signature
    assert inspect.getdoc(func).splitlines()[0] in top                       # and its summary line
    assert inspect.getdoc(module).index(inspect.cleandoc(module.__module_doc__)) > 0   # the module's text follows
    ext = importlib.util.spec_from_file_location("posenc_book_for_docs", Path(__file__).resolve().parents[1] / "book" / "_ext" / "posenc_book.py")
    book = importlib.util.module_from_spec(ext)
    ext.loader.exec_module(book)
    lines = ["whatever autodoc prepared"]
    book._module_docstring(None, "module", f"posenc.{name}", module, {}, lines)
    assert lines == inspect.cleandoc(module.__module_doc__).splitlines()      # the API page: the module's own text
    lines = ["kept"]
    book._module_docstring(None, "function", f"posenc.{name}.{function}", func, {}, lines)
    assert lines == ["kept"]
