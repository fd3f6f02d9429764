"""Every measured number in the chapters' prose comes from the page: glued from the run, or checked by its code.

A decimal number or a percentage in the text of a chapter that trains models
(outside maths, code spans and roles) must either be inserted from the run
(myst-nb's ``{glue:text}`` role, :func:`posenc.glue`) or appear literally in a
code cell of the same notebook: the bound of an assert, or a published
constant written in code. A number typed into the prose alone would be one
machine's, one seed's result.
"""

import json
from decimal import Decimal
import re
from pathlib import Path

import pytest
from _myst_roles import ROLE

ROOT = Path(__file__).resolve().parents[1]
#: Every chapter and the appendix: the later ones quote trained models and measured costs, the
#: first ones numbers their code computes (and checks).
CHECKED = sorted(p.stem for p in (ROOT / "chapters").glob("*.ipynb"))
#: Numbers a chapter quotes from a paper, or that follow from a formula, not measured here:
#: ``{chapter: {number: source}}``.
PUBLISHED = {
    "01_why_position": {"0.333": "the marker 1/(i + 1) at i = 2", "0.25": "1/(i + 1) at i = 3",
                        "20%": "Su's experience with RoPE (10 to 20% beyond L)"},
    "05_kerple_sandwich_t5": {"14.4": "Press et al., Table: T5 bias, thousand words per second",
                              "28.3": "Press et al.: ALiBi", "28.5": "Press et al.: sinusoidal"},
    "06_xpos": {"3.5": "1/zeta_0 = 1.4/0.4 for gamma = 0.4"},
    "09_training_for_length": {"85.6%": "RULER's threshold: Llama-2-7B's average score at 4K (Hsieh et al., 2024)"},
}
_MATH = re.compile(r"\$\$.*?\$\$|\$[^$\n]+\$", re.S)
_CODE = re.compile(r"```.*?```|`[^`\n]*`", re.S)
_LINK = re.compile(r"\]\([^)]*\)|https?://\S+")
_DIRECTIVE = re.compile(r"^(:::|```)\{[^}]*\}.*$|^:[a-z-]+:.*$", re.M)
_REFERENCE = re.compile(r"\b(?:Proposition|Prop\.|Section|Sec\.|Exercise|exercise|Table|Figure|Fig\.|Eq\.|Equation|"
                        r"Theorem|Lemma|Corollary|Chapter|chapter|Llama|version|Python|PyTorch|torch|plotly)"
                        r"\s+\d+(?:\.\d+)+")      # "Proposition 3.1", "Llama 3.1": names, not measurements
_NUMBER = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?\s?%|\d+\.\d+)(?![\w.]*\d)")


def prose_numbers(markdown: str) -> list:
    """The decimal numbers and percentages of ``markdown`` outside maths, code, roles, links and directives."""
    text = ROLE.sub(" ", markdown)
    text = _CODE.sub(" ", text)
    text = _MATH.sub(" ", text)
    text = _LINK.sub(" ", text)
    text = _DIRECTIVE.sub(" ", text)
    text = _REFERENCE.sub(" ", text)
    return [m.group(1).replace(" ", "") for m in _NUMBER.finditer(text)]


def glue_names(markdown: str) -> list:
    return re.findall(r"\{glue(?::text)?\}`([^`:]+)", markdown)


def test_prose_numbers_finds_what_it_should():
    md = ("ALiBi is 0.08 nats above, 3% more, {glue:text}`ch7-x` and $0.5 \\log n$ and `0.25` and "
          "{cite}`press2022alibi` [a](https://x.org/1.5) 1.5× and (0.95) v1.2.3 and 12.5 % "
          "(Proposition 3.1, Llama 3.1's rule)")
    assert prose_numbers(md) == ["0.08", "3%", "1.5", "0.95", "12.5%"]
    assert glue_names("{glue:text}`a-b` and {glue}`c`, {glue:text}`d:.2f`") == ["a-b", "c", "d"]


def _cells(name):
    nb = json.loads((ROOT / "chapters" / f"{name}.ipynb").read_text())
    md = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown"]
    code = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
    return md, code


@pytest.mark.parametrize("name", CHECKED)
def test_measured_numbers_in_the_prose_are_glued_or_checked(name):
    md, code = _cells(name)
    source = "\n".join(code)
    code_numbers = set(re.findall(r"(?<![\w.])\d+\.\d+", source)) | {
        m.replace(" ", "") for m in re.findall(r"(?<![\w.])\d+(?:\.\d+)?\s?%", source)}
    typed = []
    for cell in md:
        for number in prose_numbers(cell):
            bare = number.rstrip("%")
            if number in PUBLISHED.get(name, {}):
                continue
            fraction = str(Decimal(bare) / 100) if number.endswith("%") else None   # 45% checked as 0.45
            if not {number, bare, f"{bare}%", fraction} & code_numbers:
                typed.append(number)
    assert not typed, (f"{name}: numbers typed into the prose that the page neither glues nor checks: {typed}; "
                       "glue them from the run (pe.glue + {glue:text}`name`) or check them in an assert")


@pytest.mark.parametrize("name", CHECKED)
def test_every_glued_name_is_glued_by_the_page(name):
    md, code = _cells(name)
    source = "\n".join(code)
    used = {n for cell in md for n in glue_names(cell)}
    missing = sorted(n for n in used if not re.search(r"glue\(\s*f?[\"']" + re.escape(n) + r"[\"']", source)
                     and not re.search(r"glue\(\s*f[\"'][^\"']*\{", source))
    assert not missing, f"{name}: the prose reads glued names that no code cell glues: {missing}"


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_every_exempted_number_is_still_in_the_prose(name):
    md, _ = _cells(name)
    quoted = {number for cell in md for number in prose_numbers(cell)}
    stale = sorted(set(PUBLISHED[name]) - quoted)
    assert not stale, f"{name}: PUBLISHED lists numbers its prose no longer quotes: {stale}"
