"""The chapter notebooks as files: clean, complete, and installing the library where it is missing."""

import ast
import importlib.util
import json
import re
from pathlib import Path

import pytest
from _myst_roles import ROLE

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("install_cells", ROOT / "book" / "install_cells.py")
install_cells = importlib.util.module_from_spec(spec)
spec.loader.exec_module(install_cells)

CHAPTERS = install_cells.chapters()


def test_every_chapter_notebook_is_in_the_table_of_contents():
    on_disk = sorted(p.name for p in (ROOT / "chapters").glob("*.ipynb"))
    assert sorted(p.name for p in CHAPTERS) == on_disk


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_chapter_is_stored_clean_and_has_exercises(path):
    nb = json.loads(path.read_text())
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [] and cell["execution_count"] is None, "stored with outputs"
    text = "".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
    assert text.lstrip().startswith("# "), "a chapter starts with its title"
    assert "## Exercises" in text and ":class: dropdown" in text, "exercises with hidden solutions"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_a_solution_check_is_folded_like_its_solution(path):
    """The code cell right after a solution (it computes or checks the answer) is folded too (``hide-cell``).

    Else the site shows the answer's code open under a folded solution, and the reader's copy
    (``book/reader_copy.py``, which moves a folded cell after a solution into the solution's fold) would keep
    it as a cell that Run All executes, printing the answer.
    """
    cells = json.loads(path.read_text())["cells"]
    open_checks = [i + 1 for i, (cell, after) in enumerate(zip(cells, cells[1:]))
                   if cell["cell_type"] == "markdown" and ":::{admonition} Solution" in "".join(cell["source"])
                   and after["cell_type"] == "code" and "hide-cell" not in after["metadata"].get("tags", [])]
    assert not open_checks, f"code cells {open_checks} follow a solution but are not tagged hide-cell"


def _shows_a_glue_call(source):
    """Whether a cell's last statement is a bare ``pe.glue(...)`` call (or a tuple of them) without a closing ``;``.

    ``glue`` returns its text (for ``print``), so such a cell prints the glued string under itself on the page.
    """
    lines = [line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))]
    try:
        body = ast.parse("\n".join(lines)).body
    except SyntaxError:
        return False
    if not body or not isinstance(body[-1], ast.Expr) or source.rstrip().endswith(";"):
        return False
    value = body[-1].value
    calls = value.elts if isinstance(value, ast.Tuple) else [value]
    return any(isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) and c.func.attr == "glue" for c in calls)


def test_a_glued_string_is_caught_by_the_helper():
    assert _shows_a_glue_call('pe.glue("a", x)\n')
    assert _shows_a_glue_call('x = 1\npe.glue("a", x), pe.glue("b", x)')
    assert not _shows_a_glue_call('pe.glue("a", x);')
    assert not _shows_a_glue_call('pe.glue("a", x)\nprint(x)')
    assert not _shows_a_glue_call('fig')


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_no_cell_shows_a_glued_string(path):
    """Glued text reaches the prose; a cell ending in a bare ``pe.glue(...)`` would also print it, quoted, as output."""
    cells = json.loads(path.read_text())["cells"]
    leaking = [i for i, cell in enumerate(cells) if cell["cell_type"] == "code" and _shows_a_glue_call("".join(cell["source"]))]
    assert not leaking, f"code cells {leaking} end in a pe.glue(...) call: end them with ';'"


def test_install_cells_match_the_configured_repository():
    """The first code cell of every chapter installs posenc from the book's repository, as the site links it.

    The URL is discovered as the build discovers it (``repository.url`` of _config.yml, else GitHub
    Actions' GITHUB_REPOSITORY, else a GitHub origin remote); with none, the plain `pip install -e .` block.
    """
    url, source = install_cells.discover()
    block = install_cells.install_block(url)
    for path in CHAPTERS:
        cells = json.loads(path.read_text())["cells"]
        code = "".join(next(c for c in cells if c["cell_type"] == "code")["source"])
        assert block in code, (f"{path.name} does not install posenc from {url or '(no repository URL)'} "
                               f"(from {source}): run `make install-cells` and commit the chapters")


def test_install_block_round_trip():
    """Switching the URL rewrites the block in place, and a plain import is upgraded."""
    plain = "import torch\nimport posenc as pe\n\ntorch.manual_seed(0)"
    with_url = install_cells.updated(plain, install_cells.install_block("https://example.org/book"))
    assert '%pip install --quiet "posenc @ git+https://example.org/book"' in with_url
    assert with_url.endswith("\n\ntorch.manual_seed(0)") and with_url.startswith("import torch\ntry:")
    without = install_cells.updated(with_url, install_cells.install_block(""))
    assert "%pip" not in without and "pip install -e ." in without
    assert install_cells.updated(without, install_cells.install_block("https://example.org/book")) == with_url
    with pytest.raises(ValueError, match="does not import posenc"):
        install_cells.updated("import torch", install_cells.install_block(""))


def _roles_in_math(markdown: str) -> list:
    """``{role}`...``` roles that stand inside ``$...$`` or ``$$...$$`` math (fenced code blocks and ``\\$`` skipped)."""
    text = re.sub(r"^(```|~~~).*?^\1", "", markdown, flags=re.S | re.M).replace(r"\$", "")
    roles: list = []

    def mark(match):  # each role becomes one mark without backticks, so that code spans can go
        roles.append(match.group())
        return f"\0{len(roles) - 1}\0"

    text = re.sub(r"`[^`]*`", "", ROLE.sub(mark, text))
    maths = re.findall(r"\$\$.+?\$\$|\$[^$]+?\$", text, flags=re.S)
    back = lambda m: re.sub("\0(\\d+)\0", lambda r: roles[int(r.group(1))], m)
    return [back(m) for m in maths if "\0" in m]


def test_roles_in_math_are_found():
    assert _roles_in_math("a $d = {glue:text}`x`$ b") == ["$d = {glue:text}`x`$"]
    assert _roles_in_math("$$\n{glue:math}`y`\n$$") == ["$$\n{glue:math}`y`\n$$"]
    assert _roles_in_math("$d$ = {glue:text}`x` and $L$, costs \\$5 {cite}`a` $n$") == []
    assert _roles_in_math("```\n$x = {glue:text}`x`$\n```\n") == []
    assert _roles_in_math("`$POSENC_CACHE/runs` holds {glue:text}`x`, and $L$") == []  # a $ in code is no math


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_no_role_inside_math(path):
    """MyST reads no role inside math: a ``{glue:text}`` there reaches the page as raw text and flips the
    math delimiters after it (the page then shows ``\\)L/4\\(``). A glued number stands outside the math."""
    cells = json.loads(path.read_text())["cells"]
    found = {i: _roles_in_math("".join(c["source"])) for i, c in enumerate(cells) if c["cell_type"] == "markdown"}
    assert not {i: m for i, m in found.items() if m}, "roles inside math (move them out of the $...$)"
