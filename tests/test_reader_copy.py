"""Reader copies of the chapters (book/reader_copy.py): plain CommonMark, no MyST left, solutions folded."""

import ast
import copy
import importlib.util
import json
import re
import types
from pathlib import Path

import nbformat
import pytest
from markdown_it import MarkdownIt

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "chapters").glob("*.ipynb"))
ROLE = re.compile(r"\{[a-z][\w:+.-]*\}`")
ROLE_HTML = re.compile(r"\{[a-z][\w:+.-]*\}<code>")
TARGET_LINE = re.compile(r"(?m)^\s*\([^()\s]+\)=\s*$")
GLUE_ROLE = re.compile(r"\{glue(?::[a-z]*)?\}`([^`]+)`")
EQ_ROLE = re.compile(r"\{eq\}`([^`]+)`")
SOLUTION = re.compile(r"^:{3,}\{admonition\} Solution\n:class: dropdown$", re.M)
GLUED = "0.12 (0.10–0.14)"


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def rc():
    return _load("posenc_reader_copy_for_tests", ROOT / "book" / "reader_copy.py")


@pytest.fixture(scope="module")
def labels(rc):
    return rc.bib_labels(ROOT / "book" / "references.bib")


@pytest.fixture(scope="module")
def references(rc):
    return rc.bib_references(ROOT / "book" / "references.bib")


@pytest.fixture(scope="module")
def book_numbers(rc):
    return rc.book_equation_numbers(ROOT / "_toc.yml")


def _md(source):
    return {"cell_type": "markdown", "metadata": {}, "source": source}


def _code(source, tags=(), outputs=()):
    meta = {"tags": list(tags)} if tags else {}
    return {"cell_type": "code", "metadata": meta, "source": source, "execution_count": 3, "outputs": list(outputs)}


def _nb(*cells):
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    for i, cell in enumerate(cells):
        nb.cells.append(nbformat.from_dict({**cell, "id": f"c{i}"}))
    return json.loads(nbformat.writes(nb))


def _text(cell):
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def _markdown(nb):
    return [_text(c) for c in nb["cells"] if c["cell_type"] == "markdown"]


def _render(text):
    return MarkdownIt("commonmark").render(text)


# --- (a) every chapter ---------------------------------------------------------------------------

@pytest.mark.parametrize("with_glue", [False, True], ids=["no-glue", "glue"])
@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_every_chapter_reads_without_myst(rc, labels, book_numbers, path, with_glue):
    nb = json.loads(path.read_text(encoding="utf8"))
    before = copy.deepcopy(nb)
    page = f"chapters/{path.stem}"
    source = "\n".join(_markdown(nb))
    glue_names = GLUE_ROLE.findall(source)
    glue = {name: GLUED for name in glue_names} if with_glue else None
    numbers = rc.page_numbers(book_numbers, page)
    result = rc.reader_notebook(nb, glue=glue, labels=labels, equations=numbers)
    assert nb == before
    nbformat.validate(nbformat.from_dict(result))

    details = strong = computed = 0
    for cell in result["cells"]:
        if cell["cell_type"] != "markdown" or cell.get("id") == rc.NOTE_ID:
            continue
        text = _text(cell)
        html = _render(text)
        where = f"{path.name}: {text[:80]!r}"
        assert not ROLE.search(text) and not ROLE_HTML.search(html), where
        assert ":::" not in text and "```{" not in text and "language-{" not in html, where
        assert not TARGET_LINE.search(text) and not re.search(r"\(\S+\)=", html), where
        assert ":class:" not in text and not re.search(r"\$\$[ \t]*\(", text), where
        assert not re.search(r"\bSolution\b", re.sub(r"<details>.*?</details>", "", html, flags=re.S)), where
        assert html.count("<details>") == html.count("</details>") == html.count("<summary>Solution</summary>\n<p>")
        details += html.count("<details>")
        strong += html.count(GLUED)
        assert GLUED not in re.sub(r"<strong>.*?</strong>", "", html, flags=re.S), where  # all of them bold
        computed += len(re.findall(r"\(computed by the code (?:above|below)\)", text))
    assert details == len(SOLUTION.findall(source)) > 0
    assert (strong, computed) == ((len(glue_names), 0) if with_glue else (0, len(glue_names)))

    # equations: the site's numbers, as \tag on the equation and (n) where it is cited
    copied = "\n".join(_markdown(result))
    own = rc.page_equations(nb)
    assert sorted(re.findall(r"\\tag\{(\d+)\}", copied), key=int) == [numbers[k] for k in own]
    for label in EQ_ROLE.findall(source):
        assert f"({numbers[label]})" in copied
    cited = {k for m in re.finditer(r"\{cite(?::\w+)?\}`([^`]+)`", source) for k in m[1].split(",")}
    assert all(f"{labels[k.strip()]}]" in copied or f"{labels[k.strip()]}, " in copied for k in cited)

    # code cells: cleared, the solutions' code moved into their folds, nothing else changed
    notes = [c for c in result["cells"] if c.get("id") == rc.NOTE_ID]
    assert len(notes) == 1 and result["cells"][1] is notes[0] and _text(result["cells"][0]).startswith("# ")
    code_in = [c for c in nb["cells"] if c["cell_type"] == "code" and "hide-cell" not in c["metadata"].get("tags", [])]
    code_out = [c for c in result["cells"] if c["cell_type"] == "code"]
    assert [_text(c) for c in code_in] == [_text(c) for c in code_out]
    for new in code_out:
        assert new["outputs"] == [] and new["execution_count"] is None and "cellView" not in new["metadata"]


def test_the_chapters_use_no_other_myst_than_the_copy_converts(rc):
    """The check above is only as good as its regexes: MyST's own parser finds the same blocks."""
    mdit = pytest.importorskip("myst_parser.parsers.mdit")
    from markdown_it.renderer import RendererHTML
    from myst_parser.config.main import MdParserConfig

    parser = mdit.create_md_parser(MdParserConfig(enable_extensions={"colon_fence", "dollarmath", "amsmath"}),
                                   RendererHTML)
    for path in CHAPTERS:
        nb = json.loads(path.read_text(encoding="utf8"))
        kinds, labelled = set(), []
        for text in _markdown(nb):
            for token in parser.parse(text):
                if token.type in ("fence", "colon_fence") and token.info.strip().startswith("{"):
                    kinds.add(token.info.split("}")[0] + "}")
                if token.type == "math_block_label":
                    labelled.append(token.info)
                if token.type == "amsmath" and token.meta.get("numbered") != "*":
                    labelled.append(f"#{len(labelled) + 1}")
        assert kinds <= {"{admonition}"}, (path.name, kinds)
        assert labelled == rc.page_equations(nb), path.name


# --- (b) each conversion ------------------------------------------------------------------------------

def test_a_solution_becomes_a_folded_details_block_with_its_math_and_code(rc):
    text = ("Before the solution.\n"
            "::::{admonition} Solution\n"
            ":class: dropdown\n"
            "Use $x^2$ and\n"
            "$$\n"
            "y = x^2\n"
            "$$ (eq-in)\n"
            "\n"
            ":::{note}\n"
            "An inner note.\n"
            ":::\n"
            "```python\n"
            "print('::: not a fence')  # {cite}`not-a-role`\n"
            "```\n"
            "::::\n"
            "After the solution.")
    out = _markdown(rc.reader_notebook(_nb(_md(text))))[-1]
    assert out.startswith("Before the solution.\n\n<details>\n<summary>Solution</summary>\n\nUse $x^2$ and\n")
    assert "$$\ny = x^2\n\\tag{1}\n$$" in out
    assert "> **Note**\n>\n> An inner note." in out
    assert "```python\nprint('::: not a fence')  # {cite}`not-a-role`\n```" in out  # code is left alone
    assert out.endswith("\n\n</details>\n\nAfter the solution.")
    html = _render(out)
    inside = html.split("<details>")[1].split("</details>")[0]
    assert "<p>Use $x^2$ and" in inside and "<blockquote>" in inside
    assert '<pre><code class="language-python">' in inside
    assert "<p>After the solution.</p>" in html.split("</details>")[1]


def test_other_admonitions_and_directives_become_plain_markdown(rc):
    text = (":::{admonition} A title with $m$\nBody {cite}`a`.\n:::\n\n"
            "```{warning} First line\nSecond line.\n```\n\n"
            "```{math}\n:label: eq-m\na = b\n```\n\n"
            "```{code-block} python\nx = 1\n```\n\n"
            ":::{dropdown} More\nHidden.\n:::")
    out = _markdown(rc.reader_notebook(_nb(_md(text)), labels={"a": "Alpha, 2020"}))[-1]
    assert "> **A title with $m$**\n>\n> Body [Alpha, 2020]." in out
    assert "> **Warning**\n>\n> First line\n> Second line." in out
    assert "$$\na = b\n\\tag{1}\n$$" in out
    assert "```python\nx = 1\n```" in out
    assert "<details>\n<summary>More</summary>\n\nHidden.\n\n</details>" in out
    assert "{" not in re.sub(r"\\tag\{1\}", "", out)


def test_citations_read_as_on_the_site(rc):
    labels = {"alpha2020": "Alpha et al., 2020", "beta2019": "Beta and Gamma, 2019"}  # the bibliography's order
    text = ("One {cite}`beta2019,alpha2020`, two {cite:p}`alpha2020`, three {cite:t}`alpha2020`, "
            "four {cite}`unknown`, five {cite:p}`{see}alpha2020{p. 3}`, six {cite}`alpha2020`(not a link).")
    out = _markdown(rc.reader_notebook(_nb(_md(text)), labels=labels))[-1]
    assert out == ("One [Alpha et al., 2020, Beta and Gamma, 2019], two [Alpha et al., 2020], "
                   "three Alpha *et al.* [Alpha et al., 2020], four [unknown], five [see Alpha et al., 2020, p. 3], "
                   "six \\[Alpha et al., 2020\\](not a link).")
    assert "<a" not in _render(out)


def test_glue_with_and_without_a_value(rc):
    nb = _nb(_code('pe.glue("known", 1.5)\npe.glue("above", 2)'),
             _md("A {glue:text}`known`, B {glue:text}`known:.2f`, C {glue:text}`above`, D {glue:text}`later-3`, "
                 "E {glue:text}`stars`, F {glue:text}`nowhere`, G {glue:text}`spread`× or {glue:text}`spread`, "
                 "**H {glue:text}`known`: bold**."),
             _code('for n in range(4):\n    pe.glue(f"later-{n}", n)'))
    out = rc.reader_notebook(nb, glue={"known": "1.5", "stars": "a*b_c", "spread": "2.1 (1.9–2.3)"})
    text = _markdown(out)[1]
    assert text == ("A **1.5**, B **1.50**, C (computed by the code above), D (computed by the code below), "
                    "E **a\\*b\\_c**, F (computed by the code below), "
                    "G <strong>2.1 (1.9–2.3)</strong>× or **2.1 (1.9–2.3)**, **H 1.5: bold**.")  # no ** before ×
    html = _render(text)
    assert "<strong>a*b_c</strong>" in html and html.count("<strong>2.1 (1.9–2.3)</strong>") == 2
    note = _markdown(out)[0]
    assert "**bold**" in note and "computed by the code above" in note
    no_glue = _markdown(rc.reader_notebook(nb))[0]
    assert "bold" not in no_glue and "computed by the code" in no_glue


def test_equations_are_numbered_as_on_the_site(rc, tmp_path):
    text = ("$$\na = 1\n$$ (eq-a)\n\n$$\nb = 2\n$$\n\n\\begin{equation}\nc = 3\n\\end{equation}\n\n"
            "\\begin{align*}\nd &= 4\n\\end{align*}\n\n$$e = 5$$ (eq-e)\n\nSee {eq}`eq-e`, {eq}`eq-a` and {eq}`eq-x`.")
    nb = _nb(_md("# Title\n" + text))
    assert rc.page_equations(nb) == ["eq-a", "#2", "eq-e"]
    out = _markdown(rc.reader_notebook(nb))
    body = out[0]
    assert "$$\na = 1\n\\tag{1}\n$$" in body and "$$\nb = 2\n$$" in body
    assert "c = 3\n\\tag{2}\\end{equation}" in body and "\\tag" not in body.split("align*")[1].split("$$e")[0]
    assert "$$\ne = 5\n\\tag{3}\n$$" in body and body.endswith("See (3), (1) and (eq-x).")
    site = _markdown(rc.reader_notebook(nb, equations={"eq-a": "7", "#2": "8", "eq-e": "9", "eq-x": "2"}))[0]
    assert "\\tag{7}" in site and "\\tag{8}" in site and site.endswith("See (9), (7) and (2).")

    # the whole book: one counter, page after page in the order of the table of contents
    (tmp_path / "_toc.yml").write_text("format: jb-book\nroot: intro\nparts:\n  - chapters:\n      - file: a\n"
                                       "  - numbered: false\n    chapters:\n      - file: b\n")
    (tmp_path / "intro.md").write_text("# Intro\n")
    (tmp_path / "a.md").write_text("# A\n$$\nx\n$$ (eq-a1)\n\n$$\ny\n$$ (eq-a2)\n")
    (tmp_path / "b.ipynb").write_text(json.dumps(_nb(_md("# B\n$$\nz\n$$ (eq-b1)\n\n\\begin{equation}\nw\n"
                                                          "\\end{equation}\n\nSee {eq}`eq-a1`."))))
    numbers = rc.book_equation_numbers(tmp_path / "_toc.yml")
    assert numbers == {"intro": {}, "a": {"eq-a1": "1", "eq-a2": "2"}, "b": {"eq-b1": "3", "#2": "4"}}
    assert rc.page_numbers(numbers, "b") == {"eq-a1": "1", "eq-a2": "2", "eq-b1": "3", "#2": "4"}


def test_targets_comments_and_references(rc):
    text = "(sec-x)=\n## The section\n\n% a comment\nSee {ref}`sec-x`, {ref}`this one <sec-x>`, {doc}`../b/page` " \
           "and {doc}`the page <page>`, {math}`x^2`."
    out = _markdown(rc.reader_notebook(_nb(_md(text)), refs={"page": "A page"}))[-1]
    assert out == "## The section\n\nSee The section, this one, A page and the page, $x^2$."


def test_hidden_and_removed_code_cells(rc):
    nb = _nb(_md("# T"), _code("print(1)", ["hide-cell"], [{"output_type": "stream", "name": "stdout", "text": "1\n"}]),
             _code("%%time\nx = 1", ["hide-cell"]), _code("secret = 2", ["remove-cell"]),
             _code("y = 3", ["hide-input"]), _code("z = 4"))
    out = rc.reader_notebook(nb)
    code = [c for c in out["cells"] if c["cell_type"] == "code"]
    # hide-cell code that follows no solution is hidden helper code: later cells may need it, so it stays a cell
    assert [_text(c) for c in code] == [f"{rc.CODE_TITLE}\nprint(1)", f"%%time\n{rc.CODE_TITLE}\nx = 1",
                                        f"{rc.CODE_TITLE}\ny = 3", "z = 4"]
    for cell in code[:3]:
        assert cell["metadata"]["jupyter"] == {"source_hidden": True} and cell["metadata"]["cellView"] == "form"
    assert code[0]["metadata"]["tags"] == ["hide-cell"] and code[3]["metadata"] == {}
    assert all(c["outputs"] == [] and c["execution_count"] is None for c in code)
    assert [c["cell_type"] for c in out["cells"][:2]] == ["markdown", "markdown"]
    nbformat.validate(nbformat.from_dict(out))


# --- the reference list ---------------------------------------------------------------------------------

def test_citations_link_to_the_copys_reference_list(rc):
    labels = {"alpha2020": "Alpha et al., 2020", "beta2019": "Beta and Gamma, 2019", "gamma2018": "Gamma, 2018"}
    references = {"alpha2020": "A. Alpha. [A paper.](https://doi.org/10.1/a) 2020.",
                  "beta2019": "B. Beta and C. Gamma. A book. 2019.",
                  "gamma2018": "Never cited here."}
    nb = _nb(_md("# T\nOne {cite}`beta2019,alpha2020`, two {cite:t}`alpha2020`, three {cite}`unknown`, "
                 "four {cite}`alpha2020`(not a link)."), _code("x = 1"))
    out = rc.reader_notebook(nb, labels=labels, references=references)
    nbformat.validate(nbformat.from_dict(out))
    text = _markdown(out)[0]
    assert text.endswith("One [[Alpha et al., 2020](#ref-alpha2020), [Beta and Gamma, 2019](#ref-beta2019)], "
                         "two Alpha *et al.* [[Alpha et al., 2020](#ref-alpha2020)], three [unknown], "
                         "four \\[[Alpha et al., 2020](#ref-alpha2020)\\](not a link).")
    last = out["cells"][-1]
    assert last["id"] == rc.REFERENCES_ID and _text(last) == (
        "## References\n\n"
        '- <a id="ref-alpha2020"></a>\\[Alpha et al., 2020\\] A. Alpha. [A paper.](https://doi.org/10.1/a) 2020.\n'
        '- <a id="ref-beta2019"></a>\\[Beta and Gamma, 2019\\] B. Beta and C. Gamma. A book. 2019.\n')
    html = _render("\n\n".join(_markdown(out)))
    assert '<a href="#ref-alpha2020">Alpha et al., 2020</a>' in html and "[<a href" in html
    assert '<a id="ref-alpha2020"></a>[Alpha et al., 2020] A. Alpha.' in html
    assert "(not a link)" in html and "Never cited" not in html
    plain = rc.reader_notebook(nb, labels=labels)                     # no reference list: labels as before
    assert "](#ref-" not in "\n".join(_markdown(plain)) and _text(plain["cells"][-1]) == "x = 1"


def test_bib_references_are_full_entries_with_links(rc, references, labels):
    assert set(references) == set(labels)
    alibi = references["press2022alibi"]
    assert alibi.startswith("Ofir Press, Noah") and "Train short, test long" in alibi and "2022" in alibi
    assert "(https://arxiv.org/abs/2108.12409)" in alibi and "\n" not in alibi
    linked = [k for k, v in references.items() if re.search(r"\]\(https?://", v)]
    assert len(linked) == len(references)                             # every entry of the book's bib has a link


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_every_chapters_copy_ends_with_its_references(rc, labels, references, path):
    nb = json.loads(path.read_text(encoding="utf8"))
    source = "\n".join(_markdown(nb))
    cited = {k.strip() for m in re.finditer(r"\{cite(?::\w+)?\}`([^`]+)`", source) for k in m[1].split(",")}
    cited = {re.sub(r"^\{[^}]*\}|\{[^}]*\}$", "", k).strip() for k in cited}
    out = rc.reader_notebook(nb, labels=labels, references=references)
    nbformat.validate(nbformat.from_dict(out))
    last = _text(out["cells"][-1])
    if not cited:
        assert "## References" not in last
        return
    assert last.startswith("## References\n") and out["cells"][-1]["cell_type"] == "markdown"
    listed = re.findall(r'<a id="ref-([^"]+)"></a>', last)
    assert set(listed) == cited and len(listed) == len(cited)          # every cited work, once
    assert listed == [k for k in labels if k in cited]                 # in the bibliography's order
    for key in cited:
        assert f"\\[{labels[key]}\\] {references[key]}" in last
    body = "\n".join(_markdown(out)[:-1])
    assert set(re.findall(r"\]\(#ref-([^)]+)\)", body)) == cited       # each citation links to an entry there
    html = _render(last)
    assert html.count("<li>") == len(cited) and html.count('href="http') >= len(cited)


# --- solutions do not run with the rest of the notebook --------------------------------------------------

SOLUTION_MD = ":::{admonition} Solution\n:class: dropdown\nThe answer is $42$.\n:::"


def test_a_solutions_code_moves_into_its_fold_and_is_no_cell(rc):
    code = 'answer = 6 * 7\nprint(f"answer = {answer}")\nassert pe.exercises.check("1.1", answer)'
    nb = _nb(_md("# T"), _md("**Exercise 1.** What is it?"), _code("answer = ...\npe.exercises.check('1.1', answer);"),
             _md(SOLUTION_MD), _code(code, ["hide-cell"], [{"output_type": "stream", "name": "stdout", "text": "42\n"}]),
             _code("print('```')", ["hide-cell"]), _code("after = 1"))
    out = rc.reader_notebook(nb)
    nbformat.validate(nbformat.from_dict(out))
    assert [_text(c) for c in out["cells"] if c["cell_type"] == "code"] == [
        "answer = ...\npe.exercises.check('1.1', answer);", "after = 1"]
    fold = _text(out["cells"][4])
    assert fold == ("<details>\n<summary>Solution</summary>\n\nThe answer is $42$.\n\n"
                    f"{rc.SOLUTION_CODE}\n\n```python\n{code}\n```\n\n"
                    f"{rc.SOLUTION_CODE}\n\n````python\nprint('```')\n````\n\n</details>")
    html = _render(fold)
    inside = html.split("<details>")[1].split("</details>")[0]
    assert "answer = 6 * 7" in inside and html.count('<code class="language-python">') == 2
    assert "42\n" not in json.dumps(out)                      # the stored output is gone too
    note = _text(out["cells"][1])
    assert "folded" in note and "never shows an answer" in note and "copy it into a cell" in note


def _solution_cells(cells):
    """Indices of the code cells of a solution: hide-cell code cells after a solution admonition."""
    found, after_solution = [], False
    for i, cell in enumerate(cells):
        hidden = cell["cell_type"] == "code" and "hide-cell" in cell["metadata"].get("tags", [])
        if hidden and after_solution:
            found.append(i)
        after_solution = (hidden and after_solution) or (
            cell["cell_type"] == "markdown" and bool(SOLUTION.search(_text(cell))))
    return found


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_no_solution_of_any_chapter_runs_with_the_copy(rc, labels, path):
    """Run All in JupyterLab or Colab runs code cells only: no solution's code is one, each is in its fold."""
    nb = json.loads(path.read_text(encoding="utf8"))
    hidden = [c for c in nb["cells"] if c["cell_type"] == "code" and "hide-cell" in c["metadata"].get("tags", [])]
    assert len(_solution_cells(nb["cells"])) == len(hidden)  # every hide-cell cell of a chapter is a solution's
    out = rc.reader_notebook(nb, labels=labels)
    code = "\n".join(_text(c) for c in out["cells"] if c["cell_type"] == "code")
    folds = re.findall(r"<details>.*?</details>", "\n".join(_markdown(out)), flags=re.S)
    for cell in hidden:
        source = _text(cell)
        assert source not in code, f"{path.name}: a solution is a code cell: {source[:80]!r}"
        assert any(f"```python\n{source.rstrip()}\n```" in fold for fold in folds), source[:80]
    for cell in out["cells"]:
        if cell["cell_type"] == "code":
            assert "hide-cell" not in cell["metadata"].get("tags", []) and cell["outputs"] == []
            assert "pe.exercises.check" not in _text(cell) or _text(cell).startswith("answer = ...")


def _names(source):
    """(names a cell assigns, names it reads), IPython magics left out."""
    tree = ast.parse("\n".join(line for line in source.split("\n") if not line.lstrip().startswith(("%", "!"))))
    stores, loads = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (stores if isinstance(node.ctx, (ast.Store, ast.Del)) else loads).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            stores.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            stores.update((a.asname or a.name).split(".")[0] for a in node.names)
    return stores, loads


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_no_later_cell_needs_a_solution(path):
    """The copy skips the solutions: no code cell after one reads a name it assigns (the value would differ)."""
    cells = [c for c in json.loads(path.read_text(encoding="utf8"))["cells"] if c["cell_type"] == "code"]
    assigned = set()
    for cell in cells:
        stores, loads = _names(_text(cell))
        if "hide-cell" in cell["metadata"].get("tags", []):
            assigned |= stores
        else:
            assert not assigned & loads, f"{path.name}: {sorted(assigned & loads)} come from a solution"


def test_glue_values_read_myst_nb_glue_files(rc, tmp_path):
    path = tmp_path / "page.glue.json"
    path.write_text(json.dumps({
        "price": {"output_type": "display_data", "metadata": {"scrapbook": {"name": "price"}},
                  "data": {"text/plain": "'2.1 (1.9–2.3)'"}},
        "number": {"output_type": "display_data", "metadata": {}, "data": {"text/plain": "0.5"}},
        "md": {"output_type": "display_data", "metadata": {}, "data": {"text/markdown": "**x**", "text/plain": "<M>"}},
    }))
    assert rc.glue_values(path) == {"price": "2.1 (1.9–2.3)", "number": "0.5", "md": "**x**"}
    assert rc.glue_values(tmp_path / "missing.glue.json") == {}


def test_bib_labels_are_the_sites(rc, labels):
    assert labels["press2022alibi"] == "Press et al., 2022"
    assert labels["chiang2022overcoming"] == "Chiang and Cholak, 2022"
    assert len(set(labels.values())) == len(labels)
    keys = list(labels)
    assert keys == sorted(keys, key=lambda k: keys.index(k))  # an order: the bibliography's
    assert rc.bib_labels(ROOT / "book" / "references.bib") == labels


# --- (c) the input is left as it was ---------------------------------------------------------------------

def test_the_input_notebook_is_not_changed(rc):
    nb = _nb(_md("# T\n:::{admonition} Solution\n:class: dropdown\n{cite}`a` {glue:text}`g`\n:::"),
             _code("pe.glue('g', 1)", ["hide-cell"], [{"output_type": "stream", "name": "stdout", "text": "x\n"}]),
             _code("gone", ["remove-cell"]))
    before = copy.deepcopy(nb)
    out = rc.reader_notebook(nb, glue={"g": "1"}, labels={"a": "A, 2000"})
    assert nb == before and out is not nb and out["cells"][0] is not nb["cells"][0]


# --- the website's build -------------------------------------------------------------------------------------

def test_the_site_writes_the_copy_and_offers_it(tmp_path, monkeypatch):
    """The extension writes _notebooks/<page>.ipynb with this build's glue, labels and numbers, and a button."""
    ext = _load("posenc_book_for_reader_tests", ROOT / "book" / "_ext" / "posenc_book.py")
    src, out = tmp_path / "src", tmp_path / "_build" / "html"
    (src / "chapters").mkdir(parents=True)
    nb = _nb(_md("# T\n$$\nx\n$$ (eq-x)\n\nSee {eq}`eq-x`, {cite}`k` and {glue:text}`v`."), _code("pe.glue('v', 1)"))
    (src / "chapters" / "p.ipynb").write_text(json.dumps(nb))
    (src / "book.md").write_text("# B\n")
    (src / "refs.bib").write_text("@article{k,\n  title = {A Work},\n  author = {Kay, Ann},\n  journal = {J},\n"
                                  "  year = {2001},\n  doi = {10.1/k}\n}\n")
    glue_dir = tmp_path / "_build" / "jupyter_execute" / "chapters"
    glue_dir.mkdir(parents=True)
    (glue_dir / "p.glue.json").write_text(json.dumps({"v": {"data": {"text/plain": "'0.25'"}}}))

    citation = types.SimpleNamespace(key="k", formatted_entry=types.SimpleNamespace(label="Kay, 2001"))
    domains = {
        "math": types.SimpleNamespace(equations={"eq-x": ("chapters/p", 1)}),
        "cite": types.SimpleNamespace(citations=[citation]),
        "std": types.SimpleNamespace(labels={}),
    }
    env = types.SimpleNamespace(
        domains=domains, get_domain=domains.__getitem__, titles={},
        config=types.SimpleNamespace(math_numfig=True, numfig=True, math_numsep="."),
        toc_fignumbers={"chapters/p": {"displaymath": {"equation-eq-x": (12,)}}},
        doc2path=lambda page: str(src / (page + (".ipynb" if page.startswith("chapters") else ".md"))),
        mystnb_config=types.SimpleNamespace(output_folder=str(tmp_path / "_build" / "jupyter_execute")))
    app = types.SimpleNamespace(env=env, outdir=str(out), srcdir=str(src),
                                config=types.SimpleNamespace(bibtex_bibfiles=["refs.bib"]))
    buttons = [{"label": "download-source-button"}, {"label": "download-pdf-button"}]
    colab = {"type": "link", "text": "Colab", "url": f"{ext.COLAB_URL}/github/me/book/blob/main/chapters/p.ipynb"}
    binder = {"type": "link", "text": "Binder", "url": "https://mybinder.org/v2/gh/me/book/main?urlpath=tree/chapters/p.ipynb"}
    context = {"header_buttons": [{"label": "download-buttons", "buttons": buttons},
                                  {"label": "launch-buttons", "buttons": [binder, colab]}],
               "pathto": lambda name, resource: f"../{name}"}
    ext._reader_download(app, "chapters/p", "page.html", context, None)
    # Colab opens the reader copy, which the publishing workflow pushes to its branch; other launchers keep theirs
    assert colab["url"] == f"{ext.COLAB_URL}/github/me/book/blob/{ext.READER_BRANCH}/chapters/p.ipynb"
    assert binder["url"].endswith("main?urlpath=tree/chapters/p.ipynb")
    assert [b["label"] for b in buttons] == ["download-source-button", "download-reader-notebook-button",
                                             "download-pdf-button"]
    assert buttons[1]["url"] == "../_notebooks/chapters/p.ipynb"
    written = json.loads((out / "_notebooks" / "chapters" / "p.ipynb").read_text())
    text = _markdown(written)[0]
    assert "\\tag{12}" in text and text.endswith("See (12), [[Kay, 2001](#ref-k)] and **0.25**.")
    references = _text(written["cells"][-1])                      # the entries of the build's bibliography
    assert references.startswith("## References\n") and '<a id="ref-k"></a>\\[Kay, 2001\\] Ann Kay' in references
    assert "(https://doi.org/10.1/k)" in references

    context = {"header_buttons": [{"label": "download-buttons", "buttons": []}], "pathto": context["pathto"]}
    ext._reader_download(app, "book", "page.html", context, None)  # a Markdown page: no copy
    assert context["header_buttons"][0]["buttons"] == [] and not (out / "_notebooks" / "book.ipynb").exists()


def test_the_command_line_writes_copies_with_the_books_numbers(rc, book_numbers, tmp_path, capsys):
    assert rc.main([str(ROOT / "chapters" / "07_local_attention.ipynb"), "-o", str(tmp_path),
                    "--glue-dir", str(tmp_path / "none")]) == 0
    written = json.loads((tmp_path / "07_local_attention.ipynb").read_text(encoding="utf8"))
    text = "\n".join(_markdown(written))
    first = next(iter(book_numbers["chapters/07_local_attention"].values()))
    assert first != "1" and f"\\tag{{{first}}}" in text  # numbered on from the chapters before it
    assert "[Press et al., 2022]" in text and "(computed by the code" in text
    assert str(tmp_path / "07_local_attention.ipynb") in capsys.readouterr().out


def test_the_built_site_offers_every_chapters_reader_copy():
    """After `make book`: every chapter page links its copy, with the values of that build (skipped before)."""
    site = ROOT / "_build" / "html"
    pages = sorted((site / "chapters").glob("*.html")) if site.exists() else []
    if not pages:
        pytest.skip(f"no built site at {site}: run `make book` first")
    for page in pages:
        links = re.findall(r'href="([^"]*_notebooks/[^"]*\.ipynb)"', page.read_text(encoding="utf8"))
        assert links, f"{page.name} offers no copy for Jupyter / Colab"
        nb = json.loads((page.parent / links[0]).read_text(encoding="utf8"))
        text = "\n".join(_markdown(nb))
        assert not ROLE.search(text) and ":::" not in text and "(computed by the code" not in text, page.name
        code = [_text(c) for c in nb["cells"] if c["cell_type"] == "code"]
        assert all("pe.exercises.check" not in c or c.startswith("answer = ...") for c in code), page.name
        if "](#ref-" in text:                                            # citations link to the list at the end
            assert _text(nb["cells"][-1]).startswith("## References"), page.name
