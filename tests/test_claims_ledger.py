"""The claims ledger: a chapter states a verdict on a published claim only through its ledger entry (pe.claim).

Static checks of the notebooks' sources (the built site's check, that the
"Claims re-tested" page lists every entry of the executed chapters with working
links, is in test_site.py):

* every verdict ``pe.judge`` computes reaches ``pe.claim``, and none is glued
  into the prose by other means;
* the prose types no verdict ("reproduced", "not reproduced", "within seed
  noise", "not tested here") next to a citation or in bold: it reads the
  ledger's ``{glue:text}`claim-<key>```;
* every ``claim-<key>`` the prose reads is recorded by the same chapter, each
  key in one chapter only, and every recorded claim is stated by its chapter:
  read in the prose, or shown in a table the chapter displays;
* every source is an entry of book/references.bib.
"""

import ast
import json
import re
from pathlib import Path

import pytest
from _myst_roles import ROLE

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "chapters").glob("*.ipynb"))
KEY = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
VERDICT_WORDS = re.compile(r"\b(?:(?:not|partially|partly|half) )?reproduced\b|\bwithin seed noise\b|\bnot tested here\b",
                           re.I)
_CODE = re.compile(r"```.*?```|`[^`\n]*`", re.S)
_MATH = re.compile(r"\$\$.*?\$\$|\$[^$\n]+\$", re.S)


def _cells(path):
    nb = json.loads(path.read_text(encoding="utf8"))
    md = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown"]
    code = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
    return md, code


def _calls(tree, name):
    """The calls ``pe.<name>(...)`` in ``tree``."""
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
            and n.func.attr == name and isinstance(n.func.value, ast.Name) and n.func.value.id == "pe"]


def _parse(code):
    return ast.parse("\n".join(line for line in code.splitlines() if not line.lstrip().startswith(("%", "!"))))


def _names(node):
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def recorded_claims(code_cells):
    """``{key: (sources, displayed)}``: the claims a notebook records with ``pe.claim``.

    A call with a literal key (``pe.claim("key", source=..., ...)``) or a loop
    ``for key, source, ... in ROWS: pe.claim(key, source=source, ...)`` over a
    list of tuples written in the notebook, whose first items are the keys (None
    for a row that is not a claim) and second the sources. ``displayed`` is True
    when the rows' list is shown in a table (a ``Markdown(...)`` call reads it).
    """
    trees = [_parse(c) for c in code_cells]
    lists = {}
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.List) and len(node.targets) == 1 \
                    and isinstance(node.targets[0], ast.Name):
                lists[node.targets[0].id] = node.value
    shown = {name for tree in trees for n in ast.walk(tree) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Name) and n.func.id == "Markdown" for name in _names(n)}
    found = {}
    for tree in trees:
        for call in _calls(tree, "claim"):
            key = call.args[0] if call.args else None
            source = next((k.value for k in call.keywords if k.arg == "source"), None)
            if isinstance(key, ast.Constant):
                found[key.value] = (_sources(source), False)
        for loop in (n for n in ast.walk(tree) if isinstance(n, ast.For)):
            if not _calls(loop, "claim") or not isinstance(loop.iter, ast.Name) or loop.iter.id not in lists:
                continue
            for row in lists[loop.iter.id].elts:
                if isinstance(row, ast.Tuple) and isinstance(row.elts[0], ast.Constant) and row.elts[0].value:
                    found[row.elts[0].value] = (_sources(row.elts[1]), loop.iter.id in shown)
    return found


def _sources(node):
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.List, ast.Tuple)):
        return [e.value for e in node.elts if isinstance(e, ast.Constant)]
    return []


def prose_reads(md_cells):
    """The ledger keys the prose reads: ``{glue:text}`claim-<key>``` (or ``claim-<key>-sentence``)."""
    return {re.sub(r"-sentence$", "", m) for cell in md_cells for m in re.findall(r"\{glue(?::text)?\}`claim-([^`:]+)`", cell)}


def typed_verdicts(markdown):
    """Verdict words typed into the prose: in bold or italics, or in a sentence that cites a paper (roles and code aside)."""
    text = ROLE.sub(lambda m: " CITE " if m.group(0).startswith("{cite") else " ", markdown)
    text = _MATH.sub(" ", _CODE.sub(" ", text))
    emphasis = [m.group(0) for m in re.finditer(r"\*\*[^*\n]+\*\*|(?<![*\w])\*[^*\n]+\*(?![*\w])", text)]
    cited = [s for s in re.split(r"(?<=[.;:!?])\s+|\n", text) if "CITE" in s]
    return [m.group(0) for part in emphasis + cited for m in VERDICT_WORDS.finditer(part)]


def test_typed_verdicts_finds_what_it_should():
    md = ("- **Reproduced: ALiBi holds** {cite}`press2022alibi`.\n- **X holds** {cite}`a`: {glue:text}`claim-x`.\n\n"
          "Where the ranges overlap the difference is within seed noise.\n\n*not reproduced.* here")
    assert typed_verdicts(md) == ["Reproduced", "not reproduced"]
    assert typed_verdicts("A claim {cite}`x`, reproduced here. Within seed noise, elsewhere.") == ["reproduced"]
    assert prose_reads(["{glue:text}`claim-a-b-sentence` and {glue:text}`claim-c` {glue:text}`len-x`"]) == {"a-b", "c"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_the_prose_states_verdicts_only_through_the_ledger(path):
    md, _ = _cells(path)
    typed = [t for cell in md for t in typed_verdicts(cell)]
    assert not typed, (f"{path.stem} types verdicts into its prose: {typed}; record the claim with pe.claim "
                       "and read its verdict with {glue:text}`claim-<key>`")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_computed_verdict_goes_through_the_ledger(path):
    """A pe.judge result is passed to pe.claim (directly, through a name, or in the rows of a claims loop), never glued."""
    _, code = _cells(path)
    trees = [_parse(c) for c in code]
    verdict_names = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and _calls(node.value, "judge"):
                verdict_names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    claimed_names = set()
    for tree in trees:
        for call in _calls(tree, "claim"):
            claimed_names |= _names(call)
        for loop in (n for n in ast.walk(tree) if isinstance(n, ast.For) and _calls(n, "claim")):
            claimed_names |= _names(loop.iter)
            for other in trees:  # the rows of the loop: the list its name was assigned
                for node in ast.walk(other):
                    if isinstance(node, ast.Assign) and _names(loop.iter) & {t.id for t in node.targets
                                                                             if isinstance(t, ast.Name)}:
                        claimed_names |= _names(node.value)
    problems = []
    for tree in trees:
        for call in _calls(tree, "glue"):
            if _calls(call, "judge") or _names(call) & verdict_names:
                problems.append(f"pe.glue of a verdict: {ast.unparse(call)[:80]}")
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and _calls(node.value, "judge"):
                names = {t.id for t in node.targets if isinstance(t, ast.Name)}
                if not names & claimed_names:
                    problems.append(f"a verdict that reaches no pe.claim: {', '.join(sorted(names))}")
    assert not problems, f"{path.stem}: {problems}"


def test_every_claim_is_recorded_once_and_stated_by_its_chapter():
    from pybtex.database import parse_file

    bib = set(parse_file(ROOT / "book" / "references.bib").entries)
    owner, problems = {}, []
    for path in NOTEBOOKS:
        md, code = _cells(path)
        recorded, read = recorded_claims(code), prose_reads(md)
        for key in sorted(read - set(recorded)):
            problems.append(f"{path.stem} reads claim-{key}, which it does not record")
        for key, (sources, displayed) in recorded.items():
            if not KEY.fullmatch(key):
                problems.append(f"{path.stem}: {key!r} is not a ledger key")
            if key in owner:
                problems.append(f"claim {key!r} is recorded in {owner[key]} and in {path.stem}")
            owner[key] = path.stem
            if key not in read and not displayed:
                problems.append(f"{path.stem} records {key!r} but neither its prose nor a table it shows states it")
            if not sources or set(sources) - bib:
                problems.append(f"{path.stem}: claim {key!r} cites {sources}, not all in book/references.bib")
    assert not problems, problems
    assert len(owner) >= 30, f"the ledger holds {len(owner)} claims"


def test_the_claims_page_is_in_the_book_and_the_summary_links_it():
    toc = (ROOT / "_toc.yml").read_text(encoding="utf8")
    assert "- file: book/claims\n" in toc
    assert "{claims-ledger}" in (ROOT / "book" / "claims.md").read_text(encoding="utf8")
    md, _ = _cells(ROOT / "chapters" / "12_summary.ipynb")
    assert any("claims-re-tested" in cell or "book/claims.md" in cell for cell in md)


def test_the_build_reads_the_ledger_from_the_cache_and_warns_about_an_unexecuted_chapter(tmp_path, monkeypatch):
    """The claims page's entries come from the executed notebooks in the execution cache; a chapter without
    executed outputs is a warning (an error under ``-W``), never a silently shorter table."""
    import importlib.util
    import types

    import nbformat
    from jupyter_cache import get_cache
    from jupyter_cache.base import CacheBundleIn

    import posenc as pe

    spec = importlib.util.spec_from_file_location("posenc_book_for_ledger", ROOT / "book" / "_ext" / "posenc_book.py")
    ext = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ext)
    entry = pe.Claim("k", ("press2022alibi",), "A claim.", "0.1 (0.0–0.2)", "reproduced", "reproduced", "s")
    cell = nbformat.v4.new_code_cell("pe.claim('k', ...)")
    nb = nbformat.v4.new_notebook(cells=[cell], metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                                         "language": "python"}})
    executed = nbformat.from_dict(json.loads(nbformat.writes(nb)))
    executed.cells[0].outputs = [nbformat.v4.new_output(
        "display_data", {"application/papermill.record/application/vnd.posenc.claim+json": json.loads(entry.as_json())},
        metadata={"scrapbook": {"name": "claim-k-entry", "mime_prefix": "application/papermill.record/"}})]
    cache = get_cache(tmp_path / "cache")
    cache.cache_notebook_bundle(CacheBundleIn(executed, "a.ipynb"), check_validity=False)
    (tmp_path / "a.ipynb").write_text(nbformat.writes(nb))
    (tmp_path / "b.ipynb").write_text(nbformat.writes(nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell("1 + 1")], metadata=nb.metadata)))
    monkeypatch.setattr(ext, "_ledger_notebooks", lambda app: [("a", tmp_path / "a.ipynb"), ("b", tmp_path / "b.ipynb")])
    warnings = []
    monkeypatch.setattr(ext, "logger", types.SimpleNamespace(warning=lambda message, **kw: warnings.append(message)))
    app = types.SimpleNamespace(env=types.SimpleNamespace(
        mystnb_config=types.SimpleNamespace(execution_cache_path=str(tmp_path / "cache"))))
    assert ext.ledger_entries(app, "book/claims") == [("a", [entry])]
    assert len(warnings) == 1 and "b has no executed outputs" in warnings[0]
