"""Reader copies of the chapters: notebooks that read well where MyST is not rendered.

The chapters are written in MyST Markdown for the website. JupyterLab and
Colab do not render MyST: a solution admonition shows its answer open, and
roles such as ``{cite}`press2022alibi``` or ``{glue:text}`ch4-price``` appear
literally. :func:`reader_notebook` turns a chapter into a copy that reads
well there:

* a dropdown admonition (every exercise solution) becomes a folded
  ``<details>`` block, other admonitions a block quote with a bold title,
  ``{math}`` a ``$$`` block, code directives plain fenced code;
* ``{cite}`` becomes the labels the website shows (``[Press et al., 2022]``),
  ``{glue:text}`` the value of the website's run in bold (or says where the
  code computes it), ``{eq}`` the website's equation number, ``{ref}`` and
  ``{doc}`` their text; labelled equations get their number as ``\\tag{n}``
  and ``(label)=`` targets and ``%`` comments are removed;
* the code of a solution (the ``hide-cell`` code cells right after a
  folded solution) moves into the fold as a fenced code block: it is no
  longer a cell, so running the whole notebook (Run All in JupyterLab,
  Run all in Colab) never prints an answer, and the reader who wants to run
  it copies it into a cell. Other code cells hidden on the website are
  collapsed in JupyterLab and shown as a titled form in Colab;
  ``remove-cell`` cells are dropped; outputs are cleared;
* a short note under the title says where the numbers of the text come from.

The website's build writes the copy of every chapter next to the page
(``_notebooks/<page>.ipynb``, see ``book/_ext/posenc_book.py``) with the
values and numbers of that build. Outside a build::

    python book/reader_copy.py                        # every chapter, into _build/reader/
    python book/reader_copy.py chapters/03_rope.ipynb -o /tmp/copies

takes the labels from the bibliography, the equation numbers from the table
of contents, and the glued values from ``_build/jupyter_execute`` when a
build left them there.
"""

from __future__ import annotations

import argparse
import ast
import copy
import importlib.util
import json
import posixpath
import re
import sys
import unicodedata
from pathlib import Path
from typing import Mapping, Optional

ROOT = Path(__file__).resolve().parents[1]
EXTENSION = Path(__file__).resolve().parent / "_ext" / "posenc_book.py"

#: The line before a solution's code inside its fold.
SOLUTION_CODE = "The solution's code, which computes and checks the answer (to run it, copy it into a cell):"
#: First line of a cell whose code the website hides (``hide-input``, ``remove-input``).
CODE_TITLE = "# @title Code (open to read)"
#: A citation as sphinxcontrib-bibtex's ``label`` reference style writes it:
#: ``[Press et al., 2022, Su et al., 2021]``.
CITE_OPEN, CITE_CLOSE, CITE_SEP = "[", "]", ", "
#: Cell id of the note added under the title.
NOTE_ID = "reader-copy-note"
#: Cell id of the reference list added at the end.
REFERENCES_ID = "reader-copy-references"

_ADMONITIONS = {"note": "Note", "tip": "Tip", "hint": "Hint", "important": "Important", "warning": "Warning",
                "caution": "Caution", "attention": "Attention", "danger": "Danger", "error": "Error",
                "seealso": "See also", "margin": "", "sidebar": "", "epigraph": "", "topic": "",
                "pull-quote": "", "highlights": "", "card": ""}
_NO_TITLE = {"note", "tip", "hint", "important", "warning", "caution", "attention", "danger", "error", "seealso"}
_CODE_DIRECTIVES = {"code", "code-block", "sourcecode", "code-cell"}
_DROP_DIRECTIVES = {"bibliography", "tableofcontents", "toctree", "contents", "index"}
_AMSMATH_ENVS = ("equation", "multline", "gather", "align", "alignat", "flalign", "matrix", "pmatrix",
                 "bmatrix", "Bmatrix", "vmatrix", "Vmatrix", "eqnarray")

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,}|:{3,})(?P<info>.*)$")
_DIRECTIVE = re.compile(r"^\s*\{(?P<name>[^{}\s]+)\}\s*(?P<arg>.*?)\s*$")
_OPTION = re.compile(r"^\s*:(?P<key>[\w-]+):\s*(?P<value>.*?)\s*$")
_TARGET = re.compile(r"^[ \t]{0,3}\((?P<name>[^()\s]+)\)=[ \t]*$")
_COMMENT = re.compile(r"^[ \t]{0,3}%")
_BLOCK_BREAK = re.compile(r"^[ \t]{0,3}\+\+\+")
_MATH_LABEL = re.compile(r"\$\$\s*\((?P<label>[^)$\r\n]+?)\)\s*$")
_AMSMATH = re.compile(r"^[ \t]{0,3}\\begin\{(?P<env>" + "|".join(_AMSMATH_ENVS) + r")(?P<star>\*?)\}")
_INLINE = re.compile(r"(?P<role>\{(?P<name>[A-Za-z][\w+:.-]*)\}(?P<rt>`+)(?P<body>.+?)(?P=rt)(?!`))"
                     r"|(?P<code>(?P<ct>`+).+?(?P=ct)(?!`))", re.S)
_GLUE_CALL = re.compile(r"""\bglue\(\s*(?P<f>[fF]?)[rR]?(?P<q>["'])(?P<name>.*?)(?P=q)""")
_ASCII_PUNCTUATION = set("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")
_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>$|])")
_CITE_TARGET = re.compile(r"^(?:\{(?P<pre>[^{}]*)\})?(?P<key>[^{}]+?)(?:\{(?P<post>[^{}]*)\})?$")
_EXPLICIT = re.compile(r"^(?P<text>.*?)\s*<(?P<target>[^<>]+)>$", re.S)


class _Context:
    """What the conversion of one notebook needs, and what it finds on the way."""

    def __init__(self, glue, labels, equations, refs, producers, references=None):
        self.glue = dict(glue or {})
        self.references = dict(references or {})  # the reference list's entries by key: cited keys link to them
        self.cited: dict = {}                     # keys cited, in the order met
        self.labels = dict(labels or {})
        self.order = {key: i for i, key in enumerate(self.labels)}
        self.equations = equations            # None while only counting
        self.refs = dict(refs or {})
        self.producers = producers            # [(cell index, compiled glue-name pattern)]
        self.cell = 0                         # index of the cell being converted
        self.found: list = []                 # keys of the numbered equations, in order
        self.glue_known = self.glue_unknown = self.folded = self.solution_code = 0

    def number_next(self, label: Optional[str]) -> Optional[str]:
        """Record the page's next numbered equation; its number, when known."""
        key = label if label is not None else f"#{len(self.found) + 1}"
        self.found.append(key)
        return None if self.equations is None else self.equations.get(key)


# --- Inline roles --------------------------------------------------------------------------------

def _escape(text: str) -> str:
    return _MD_SPECIAL.sub(r"\\\1", text)


def _format_glue(value: str, spec: str) -> str:
    """``value`` formatted with myst-nb's ``{glue:text}`name:spec``` rules."""
    if not spec:
        return value
    kind = spec[-1]
    try:
        if kind in "bcdoxX":
            return format(int(float(value)), spec)
        if kind in "eEfFgGn%":
            return format(float(value), spec)
        return format(value, spec)
    except (TypeError, ValueError):
        return value


def _punctuation(char: str, symbols: bool) -> bool:
    category = unicodedata.category(char)
    return char in _ASCII_PUNCTUATION or category.startswith("P") or (symbols and category.startswith("S"))


def _bold(text: str, before: Optional[str], after: str) -> str:
    """``**text**`` where CommonMark reads it as bold between ``before`` and ``after``, else ``<strong>``.

    ``**`` only opens before a punctuation mark when whitespace or punctuation
    precedes it (and only closes alike): ``**2.1 (1.9–2.3)**×`` stays
    literal. Both readings of CommonMark's punctuation (with Unicode symbols,
    0.31, and without, 0.30) are checked. ``before`` is None where the text
    is already bold: it is left as it is.
    """
    def flanking(outer: str, inner: str, symbols: bool) -> bool:
        if inner.isspace():
            return False
        return not _punctuation(inner, symbols) or outer.isspace() or _punctuation(outer, symbols)

    if before is None:  # already inside bold text
        return text
    if all(flanking(before or " ", text[0], s) and flanking(after or " ", text[-1], s) for s in (False, True)):
        return f"**{text}**"
    return f"<strong>{text}</strong>"


def _glue_role(name: str, body: str, ctx: _Context, before: Optional[str] = " ", after: str = " ") -> str:
    key, spec = body, ""
    if name in ("glue:text", "glue:md") and ":" in body.rsplit("::", 1)[-1]:
        key, spec = body.rsplit(":", 1)
    key = key.split("::", 1)[-1].strip()
    if key in ctx.glue:
        ctx.glue_known += 1
        text = _format_glue(str(ctx.glue[key]), spec.strip()).strip()
        return _bold(_escape(text), before, after) if text else ""
    ctx.glue_unknown += 1
    return f"({_computed_where(key, ctx)})"


def _computed_where(key: str, ctx: _Context) -> str:
    cells = [i for i, pattern in ctx.producers if pattern.fullmatch(key)]
    return "computed by the code above" if any(i < ctx.cell for i in cells) else "computed by the code below"


def reference_anchor(key: str) -> str:
    """The id of a work's entry in a copy's reference list (``ref-press2022alibi``)."""
    return "ref-" + re.sub(r"[^A-Za-z0-9_-]", "-", key)


def _cite_role(name: str, body: str, ctx: _Context, escape: bool = False) -> str:
    """The citation as the website writes it; a label links to the copy's reference list where it has one.

    ``escape`` writes the outer brackets as ``\\[`` ``\\]``, where a ``(`` or ``[``
    follows and would make them a link.
    """
    role = name.split(":", 1)[1] if ":" in name else "p"
    cite_open, cite_close = ("\\[", "\\]") if escape else (CITE_OPEN, CITE_CLOSE)
    targets = []
    for part in body.split(","):
        match = _CITE_TARGET.match(part.strip())
        if match:
            targets.append((match["pre"] or "", match["key"].strip(), match["post"] or ""))
    targets.sort(key=lambda t: ctx.order.get(t[1], len(ctx.order)))  # the bibliography's order, as the site

    for _, key, _ in targets:
        ctx.cited.setdefault(key, None)

    def label(pre, key, post):
        text = ctx.labels.get(key, key)
        if key in ctx.references:
            text = f"[{text}](#{reference_anchor(key)})"
        return " ".join(p for p in (pre, text) if p) + (f", {post}" if post else "")

    if role.lstrip("c").startswith("t"):  # textual: "Press et al. [Press et al., 2022]"
        parts = []
        for pre, key, post in targets:
            author = ctx.labels.get(key, key).rsplit(", ", 1)[0].replace(" et al.", " *et al.*")
            author = author[:1].upper() + author[1:] if role.startswith("c") else author
            parts.append(f"{author} {cite_open}{label(pre, key, post)}{cite_close}")
        return CITE_SEP.join(parts)
    if role.startswith(("author", "cauthor")):
        return CITE_SEP.join(ctx.labels.get(k, k).rsplit(", ", 1)[0] for _, k, _ in targets)
    if role.startswith("year"):
        return CITE_SEP.join(ctx.labels.get(k, k).rsplit(", ", 1)[-1] for _, k, _ in targets)
    inner = CITE_SEP.join(label(*t) for t in targets)
    return inner if role.startswith(("al", "label")) and not role.endswith("par") else f"{cite_open}{inner}{cite_close}"


def _ref_role(name: str, body: str, ctx: _Context) -> str:
    explicit = _EXPLICIT.match(body)
    if explicit and explicit["text"]:
        return explicit["text"]
    target = (explicit["target"] if explicit else body).strip()
    for key in (target, target.lstrip("/"), posixpath.basename(target)):
        if key in ctx.refs:
            return ctx.refs[key]
    return posixpath.basename(target) if name == "doc" else target


def _role(name: str, body: str, ctx: _Context, before: Optional[str] = " ", after: str = " ") -> str:
    name = name[4:] if name.startswith("std:") else name
    if name.startswith("glue"):
        return _glue_role(name, body, ctx, before, after)
    if name.startswith(("cite", "footcite")):
        return _cite_role(name, body, ctx, escape=after[:1] in ("(", "["))  # brackets, not a link
    if name in ("eq", "math:numref"):
        label = body.strip()
        number = (ctx.equations or {}).get(label)
        return f"({number or label})"
    if name in ("math", "math:math"):
        return f"${body}$"
    if name in ("sup", "sub", "kbd", "abbr"):
        explicit = _EXPLICIT.match(body)
        return f"<{name}>{explicit['text'] if explicit else body}</{name}>"
    if name in ("ref", "doc", "numref", "term", "any", "download"):
        return _ref_role(name, body, ctx)
    explicit = _EXPLICIT.match(body)  # any other role: its text
    return explicit["text"] if explicit and explicit["text"] else body


def _inline(text: str, ctx: _Context) -> str:
    """``text`` with every role replaced; code spans are left as they are."""
    def replace(match):
        if match["code"] is not None:
            return match["code"]
        start, end = match.span()
        inside_bold = text[:start].count("**") % 2 == 1
        before = None if inside_bold else text[start - 1:start] or " "
        return _role(match["name"], match["body"], ctx, before, text[end:end + 1] or " ")
    return _INLINE.sub(replace, text)


# --- Blocks ----------------------------------------------------------------------------------------

def _dedent(lines, indent: str):
    return [line[len(indent):] if line.startswith(indent) else line.lstrip(" \t") for line in lines]


def _closing(line: str, char: str, length: int) -> bool:
    stripped = line.strip()
    return len(stripped) >= length and set(stripped) == {char}


def _directive_parts(body):
    """The options (``:key: value`` lines or a ``---`` YAML block) and the content of a directive."""
    options, i = {}, 0
    if body and body[0].strip() == "---":
        end = next((j for j in range(1, len(body)) if body[j].strip() == "---"), None)
        if end is not None:
            import yaml

            try:
                options = dict(yaml.safe_load("\n".join(body[1:end])) or {})
            except (yaml.YAMLError, TypeError, ValueError):
                options = {}
            i = end + 1
    else:
        while i < len(body) and (match := _OPTION.match(body[i])):
            options[match["key"]] = match["value"]
            i += 1
    return {k: str(v) for k, v in options.items()}, body[i:]


def _math_block(content: str, number: Optional[str]) -> list:
    tag = [f"\\tag{{{number}}}"] if number else []
    return ["$$", *content.strip("\n").split("\n"), *tag, "$$"]


def _directive(name: str, arg: str, body, ctx: _Context) -> list:
    options, content = _directive_parts(body)
    classes = options.get("class", "").split()
    if (name in _NO_TITLE or name == "math") and arg:  # their first line is content
        content = [arg, *content]
    if name in _DROP_DIRECTIVES:
        return []
    if name == "math":
        number = ctx.number_next(options["label"]) if "label" in options else None
        parts = [p.strip() for p in "\n".join(content).split("\n\n") if p.strip()]
        text = parts[0] if len(parts) == 1 else "\\begin{aligned}\n" + " \\\\\n".join(parts) + "\n\\end{aligned}"
        return _math_block(text, number)
    if name in _CODE_DIRECTIVES:
        code = "\n".join(content)
        ticks = "`" * max(3, 1 + max((len(run) for run in re.findall(r"`+", code)), default=0))
        return [f"{ticks}{arg.split()[0] if arg else ''}", *content, ticks]
    if name in ("raw",):
        return content if "html" in arg.split() else []
    if name in ("figure", "image"):
        alt = options.get("alt", "")
        caption = "\n".join(_convert(content, ctx)).strip() if name == "figure" else ""
        return [f"![{alt}]({arg})", *([""] + caption.split("\n") if caption else [])]
    if name.startswith("glue"):
        return [_glue_role("glue", arg, ctx)]
    inner = _convert(content, ctx)
    if name in ("admonition", "dropdown", "toggle", "topic", "sidebar", "card"):
        title = arg
    else:
        title = _ADMONITIONS.get(name, name.replace("-", " ").capitalize())
    title = _inline(title, ctx)
    if name in ("dropdown", "toggle") or "dropdown" in classes or "toggle" in classes:
        ctx.folded += 1
        return ["<details>", f"<summary>{title or 'Details'}</summary>", "", *inner, "", "</details>"]
    head = [f"> **{title}**", ">"] if title else []
    return head + [f"> {line}" if line.strip() else ">" for line in inner]


def _convert(lines, ctx: _Context) -> list:
    """The Markdown lines ``lines`` with every MyST block and role replaced."""
    out, text, i = [], [], 0
    blank_after = False

    def flush():
        if text:
            out.extend(_inline("\n".join(text), ctx).split("\n"))
            text.clear()

    def emit(block, indent=""):
        nonlocal blank_after
        flush()
        if out and out[-1].strip():
            out.append("")
        out.extend(indent + line if line else line for line in block)
        blank_after = True

    while i < len(lines):
        line = lines[i]
        if blank_after and line.strip():
            flush()
            out.append("")
        blank_after = False
        fence = _FENCE.match(line)
        if fence:
            char, length, indent = fence["fence"][0], len(fence["fence"]), fence["indent"]
            end = next((j for j in range(i + 1, len(lines)) if _closing(lines[j], char, length)), len(lines))
            directive = _DIRECTIVE.match(fence["info"])
            if directive and not (char == "`" and "`" in fence["info"]):
                emit(_directive(directive["name"], directive["arg"], _dedent(lines[i + 1:end], indent), ctx),
                     indent)
            else:
                flush()
                out.extend(lines[i:end + 1])
            i = end + 1
            continue
        if _TARGET.match(line) or _COMMENT.match(line) or _BLOCK_BREAK.match(line):
            i += 1
            continue
        stripped = line.strip()
        if stripped.startswith("$$"):
            block = _dollar_math(lines, i)
            if block:
                end, content, label = block
                number = ctx.number_next(label) if label else None
                emit(_math_block(content, number), line[:len(line) - len(line.lstrip())])
                i = end + 1
                continue
        ams = _AMSMATH.match(line)
        if ams:
            closing = f"\\end{{{ams['env']}{ams['star']}}}"
            end = next((j for j in range(i, len(lines)) if lines[j].rstrip().endswith(closing)), None)
            if end is not None:
                block = lines[i:end + 1]
                if not ams["star"]:
                    number = ctx.number_next(None)
                    if number and ams["env"] not in _AMSMATH_ENVS[6:12]:
                        last = block[-1].rstrip()
                        block[-1] = f"{last[:-len(closing)]}\\tag{{{number}}}{closing}"
                flush()
                out.extend(block)
                i = end + 1
                continue
        text.append(line)
        i += 1
    flush()
    return out


def _dollar_math(lines, start):
    """``(last line, content, label)`` of the ``$$`` block at ``start``, as MyST reads it, or None."""
    first = lines[start].strip()
    if len(first) > 3:
        if first.endswith("$$"):
            return start, first[2:-2], None
        label = _MATH_LABEL.search(first)
        if label:
            return start, first[2:label.start()], re.sub(r"\s+", "-", label["label"])
        if "$$" in first[2:]:
            return None
    body = [first[2:]] if first[2:].strip() else []
    for j in range(start + 1, len(lines)):
        line = lines[j].strip()
        if line.endswith("$$"):
            return j, "\n".join(body + [line[:-2]]), None
        if not line:
            return None
        label = _MATH_LABEL.search(line)
        if label:
            return j, "\n".join(body + [line[:label.start()]]), re.sub(r"\s+", "-", label["label"])
        body.append(lines[j])
    return None


# --- Notebooks -------------------------------------------------------------------------------------

def _source(cell) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def _lines_source(text: str) -> list:
    return text.splitlines(keepends=True)


def _glue_producers(cells) -> list:
    """``(cell index, pattern)`` for every ``glue("name", ...)`` call of the code cells (f-strings as patterns)."""
    found = []
    for index, cell in enumerate(cells):
        if cell.get("cell_type") != "code":
            continue
        for call in _GLUE_CALL.finditer(_source(cell)):
            name = call["name"]
            if call["f"]:  # each {field} of an f-string matches anything
                parts = re.split(r"(\{\{|\}\}|\{[^{}]*\})", name)
                pattern = "".join(re.escape(p[0]) if p in ("{{", "}}") else ".+?" if p.startswith("{") else re.escape(p)
                                  for p in parts)
            else:
                pattern = re.escape(name)
            found.append((index, re.compile(pattern)))
    return found


def page_equations(nb: dict) -> list:
    """The keys of the numbered equations of a notebook, in order.

    A labelled equation (``$$ ... $$ (label)``, ``{math}`` with ``:label:``)
    is keyed by its label, an unstarred amsmath environment (numbered by
    the website without a label) by ``"#k"``, its position ``k`` among the
    page's numbered equations.
    """
    ctx = _Context(None, None, None, None, [])
    for cell in nb.get("cells", []):
        if cell.get("cell_type") == "markdown":
            _convert(_source(cell).split("\n"), ctx)
    return ctx.found


def _note(ctx: _Context) -> str:
    parts = ["*A copy of this chapter for JupyterLab and Colab.*"]
    if ctx.glue_known:
        parts.append("The numbers in **bold** in the text are those of the run that built the published book; "
                     "when you run the cells they print the numbers of your own run, which can differ a little.")
    if ctx.glue_unknown:
        parts.append("Where the text says *(computed by the code above)* or *below*, the number is printed by "
                     "that cell when you run it.")
    if ctx.folded:
        parts.append("Solutions to the exercises are folded: open one to read it.")
    if any(key in ctx.references for key in ctx.cited):
        parts.append("Citations link to the references at the end.")
    if ctx.solution_code:
        parts.append("A solution's code is in its fold, not in a cell, so running the whole notebook never "
                     "shows an answer; to run it, copy it into a cell.")
    return " ".join(parts) + "\n"


def _hide(cell: dict, tags) -> None:
    meta = cell.setdefault("metadata", {})
    if "hide-output" in tags:
        meta.setdefault("jupyter", {})["outputs_hidden"] = True
    if not {"hide-cell", "hide-input", "remove-input"} & set(tags):
        return
    meta.setdefault("jupyter", {})["source_hidden"] = True
    meta["cellView"] = "form"
    title = CODE_TITLE
    source = _source(cell)
    if source.lstrip().startswith(("# @title", "#@title")):
        return
    if source.startswith("%%"):  # a cell magic must stay on the first line
        head, _, rest = source.partition("\n")
        cell["source"] = _lines_source(f"{head}\n{title}\n{rest}")
    else:
        cell["source"] = _lines_source(f"{title}\n{source}")


def _code_block(code: str, info: str = "python") -> list:
    """``code`` as a fenced block, its fence longer than any run of backticks inside."""
    ticks = "`" * max(3, 1 + max((len(run) for run in re.findall(r"`+", code)), default=0))
    return [f"{ticks}{info}", *code.rstrip("\n").split("\n"), ticks]


def _is_solution_code(cell: dict, tags, kept: list) -> bool:
    """Whether ``cell`` is a solution's code: a ``hide-cell`` code cell right after a folded solution.

    A chapter puts the code that computes and checks an answer right after the
    solution's dropdown admonition and tags it ``hide-cell`` (on the site it is
    folded under the solution). ``kept`` holds the cells converted so far.
    """
    if cell.get("cell_type") != "code" or "hide-cell" not in tags:
        return False
    last = kept[-1] if kept else None
    return bool(last and last.get("cell_type") == "markdown" and _source(last).rstrip().endswith("</details>"))


def _fold_solution_code(markdown: dict, cell: dict, ctx: _Context) -> None:
    """Move the code of ``cell`` into the ``<details>`` block that ends the Markdown cell ``markdown``."""
    source = _source(cell)
    text = _source(markdown).rstrip()
    head = text[:-len("</details>")].rstrip("\n")
    block = ["", SOLUTION_CODE, "", *_code_block(source), "", "</details>"]
    markdown["source"] = _lines_source(head + "\n" + "\n".join(block))
    ctx.solution_code += 1


def reader_notebook(nb: dict, *, glue: Optional[Mapping[str, str]] = None,
                    labels: Optional[Mapping[str, str]] = None,
                    equations: Optional[Mapping[str, str]] = None,
                    refs: Optional[Mapping[str, str]] = None,
                    references: Optional[Mapping[str, str]] = None) -> dict:
    """A copy of the notebook ``nb`` (nbformat 4, as a dict) that reads well without MyST.

    Args:
        nb: the chapter; it is not changed.
        glue: glued values by name (text, as :func:`glue_values` reads them):
            ``{glue:text}`` roles become the value in bold; without a value
            they say which code cell computes it.
        labels: citation label by bibliography key (:func:`bib_labels`), in the
            bibliography's order, in which a citation lists its works.
        equations: equation number (text) by label, as the website numbers
            them; keys ``"#k"`` number the page's unlabelled amsmath
            environments (see :func:`page_equations`). By default the page's
            equations are numbered 1, 2, ... in order.
        refs: the text of ``{ref}`` targets and ``{doc}`` pages, by name.
        references: the full entry (Markdown) of each work by bibliography key
            (:func:`bib_references`): the copy ends with a "References" cell
            listing the works the chapter cites, and each citation label links
            to its entry there.

    Returns:
        A new notebook: outputs cleared, execution counts None, Markdown cells
        in plain CommonMark (with ``<details>`` and ``$$`` math), each
        solution's code inside its fold as a code block (not a cell: it never
        runs unless the reader copies it into one), other hidden code cells
        collapsed, ``remove-cell`` cells left out, a note under the title and,
        with ``references``, the chapter's reference list at the end.
    """
    nb = copy.deepcopy(nb)
    cells = nb.get("cells", [])
    if equations is None:
        equations = {key: str(n) for n, key in enumerate(page_equations(nb), 1)}
    ctx = _Context(glue, labels, dict(equations), refs, _glue_producers(cells), references)
    for cell in cells:  # (target)= lines before a heading: {ref} shows the heading
        if cell.get("cell_type") == "markdown":
            lines = _source(cell).split("\n")
            for line, after in zip(lines, lines[1:]):
                if _TARGET.match(line) and after.startswith("#"):
                    ctx.refs.setdefault(_TARGET.match(line)["name"], after.lstrip("#").strip())
    kept, title_at = [], None
    for index, cell in enumerate(cells):
        ctx.cell = index
        tags = cell.get("metadata", {}).get("tags", []) or []
        if "remove-cell" in tags:
            continue
        if cell.get("cell_type") == "markdown":
            text = _source(cell)
            cell["source"] = _lines_source("\n".join(_convert(text.split("\n"), ctx)))
            if title_at is None and re.search(r"^# \S", text, re.M):
                title_at = len(kept)
        elif _is_solution_code(cell, tags, kept):
            _fold_solution_code(kept[-1], cell, ctx)
            continue
        elif cell.get("cell_type") == "code":
            cell["outputs"], cell["execution_count"] = [], None
            _hide(cell, tags)
        kept.append(cell)
    note = {"cell_type": "markdown", "metadata": {}, "source": _lines_source(_note(ctx))}
    if nb.get("nbformat", 4) > 4 or nb.get("nbformat_minor", 0) >= 5:
        ids = {c.get("id") for c in kept}
        note["id"] = next(f"{NOTE_ID}-{n}" if n else NOTE_ID for n in range(len(ids) + 1)
                          if (f"{NOTE_ID}-{n}" if n else NOTE_ID) not in ids)
    kept.insert(0 if title_at is None else title_at + 1, note)
    listed = sorted((key for key in ctx.cited if key in ctx.references), key=lambda k: ctx.order.get(k, len(ctx.order)))
    if listed:
        kept.append({"cell_type": "markdown", "metadata": {}, "source": _lines_source(_reference_list(listed, ctx))})
        if "id" in note:
            ids = {c.get("id") for c in kept}
            kept[-1]["id"] = next(f"{REFERENCES_ID}-{n}" if n else REFERENCES_ID for n in range(len(ids) + 1)
                                  if (f"{REFERENCES_ID}-{n}" if n else REFERENCES_ID) not in ids)
    nb["cells"] = kept
    return nb


def _reference_list(keys, ctx: _Context) -> str:
    """The "References" cell: each work's label and full entry, under an anchor its citations link to."""
    lines = ["## References", ""]
    for key in keys:
        label = _escape(ctx.labels.get(key, key))
        lines.append(f'- <a id="{reference_anchor(key)}"></a>\\[{label}\\] {ctx.references[key]}')
    return "\n".join(lines) + "\n"


# --- Inputs: glue, bibliography, equation numbers ----------------------------------------------------

def glue_values(path) -> dict:
    """The values glued by a page, by name, from myst-nb's ``<page>.glue.json`` ({} if it does not exist).

    The file maps each name to the output myst-nb recorded (a mime bundle
    under ``"data"``); the value is its ``text/markdown`` or ``text/plain``,
    with the quotes of a string's ``repr`` removed.
    """
    path = Path(path)
    if not path.exists():
        return {}
    values = {}
    for name, output in json.loads(path.read_text(encoding="utf8")).items():
        data = output.get("data", output) if isinstance(output, dict) else {}
        for mime in ("text/markdown", "text/plain"):
            if mime in data:
                text = data[mime]
                text = "".join(text) if isinstance(text, list) else str(text)
                if mime == "text/plain":
                    try:
                        value = ast.literal_eval(text)
                        text = value if isinstance(value, str) else text
                    except (SyntaxError, ValueError):
                        pass
                values[name] = text
                break
    return values


def _extension():
    """The book's Sphinx extension module (it registers the bibliography style)."""
    module = sys.modules.get("posenc_book")
    if module is None or not hasattr(module, "AuthorYearLabelStyle"):
        spec = importlib.util.spec_from_file_location("posenc_book", EXTENSION)
        module = importlib.util.module_from_spec(spec)
        sys.modules["posenc_book"] = module
        spec.loader.exec_module(module)
    return module


def bib_labels(bib_path) -> dict:
    """Citation label by key (``"Press et al., 2022"``), in the order of the book's bibliography.

    The labels are those of the website: the ``posenc`` pybtex style of
    ``book/_ext/posenc_book.py`` over every entry (the bibliography page
    lists them all), with ``a``, ``b``, ... where two labels would be equal.
    """
    from pybtex.database import parse_file

    style = _extension().PosencStyle()
    entries = list(style.sort(parse_file(str(bib_path)).entries.values()))
    return dict(zip((entry.key for entry in entries), style.format_labels(entries)))


def bib_references(bib_path) -> dict:
    """The full entry of every work of the bibliography, in Markdown, by key (as the website's list writes it).

    Authors, the title (linked to the paper: its ``url``, else its arXiv id,
    else its DOI), where it appeared, the year, and the arXiv id or DOI as
    links, formatted by the ``posenc`` pybtex style of
    ``book/_ext/posenc_book.py``, on one line.
    """
    from pybtex.database import parse_file

    style = _extension().PosencStyle()
    entries = list(style.sort(parse_file(str(bib_path)).entries.values()))
    return {entry.key: " ".join(entry.text.render_as("markdown").split())
            for entry in style.format_entries(entries)}


def _toc_pages(toc_path) -> list:
    """The pages of a Jupyter Book ``_toc.yml`` in the order Sphinx walks them (each page before its children)."""
    import yaml

    toc = yaml.safe_load(Path(toc_path).read_text(encoding="utf8"))
    pages = []

    def visit(item):
        if "file" in item or "root" in item:
            pages.append(str(item.get("file") or item.get("root")))
        for key in ("parts", "subtrees"):
            for part in item.get(key) or []:
                for child in part.get("chapters") or part.get("sections") or part.get("entries") or []:
                    visit(child)
        for key in ("chapters", "sections", "entries"):
            for child in item.get(key) or []:
                visit(child)

    visit(toc)
    return pages


def _read_page(path: Path) -> dict:
    if path.suffix == ".ipynb":
        return json.loads(path.read_text(encoding="utf8"))
    return {"cells": [{"cell_type": "markdown", "source": path.read_text(encoding="utf8")}]}


def book_equation_numbers(toc_path=ROOT / "_toc.yml") -> dict:
    """Equation numbers as the website shows them: ``{page: {key: number}}`` (keys as :func:`page_equations`).

    With ``numfig`` on and no numbered table of contents (the book's
    setting), Sphinx numbers the equations of the whole book with one
    counter, page after page in the order of the table of contents.
    """
    root, numbers, counter = Path(toc_path).resolve().parent, {}, 0
    for page in _toc_pages(toc_path):
        path = next((root / f"{page}{s}" for s in ("", ".ipynb", ".md") if (root / f"{page}{s}").is_file()), None)
        if path is None:
            continue
        keys = page_equations(_read_page(path))
        numbers[str(Path(page).with_suffix(""))] = {key: str(counter + n) for n, key in enumerate(keys, 1)}
        counter += len(keys)
    return numbers


def page_numbers(book_numbers: Mapping[str, Mapping[str, str]], page: str) -> dict:
    """The ``equations`` argument of a page: every labelled equation of the book, and the page's own."""
    labelled = {k: v for numbers in book_numbers.values() for k, v in numbers.items() if not k.startswith("#")}
    return {**labelled, **book_numbers.get(page, {})}


# --- In the website's build ------------------------------------------------------------------------------

def _site_equations(env, page: str, keys) -> dict:
    """The equation numbers of this build: every label of the book, and the page's own (``#k``) ones."""
    from docutils.nodes import make_id

    domain, config = env.get_domain("math"), env.config
    fignumbers = getattr(env, "toc_fignumbers", {})

    def text(numbers):
        return config.math_numsep.join(".".join(map(str, numbers)).rsplit(".", 1))

    result = {}
    for label, (doc, serial) in domain.equations.items():
        if config.math_numfig and config.numfig:
            numbers = fignumbers.get(doc, {}).get("displaymath", {}).get(make_id(f"equation-{label}"))
            if numbers:
                result[label] = text(numbers)
        else:
            result[label] = str(serial)
    own = list(fignumbers.get(page, {}).get("displaymath", {}).values())
    if config.math_numfig and config.numfig and len(own) == len(keys):
        result.update({key: text(n) for key, n in zip(keys, own) if key.startswith("#")})
    return result


def site_copy(app, pagename: str) -> Optional[str]:
    """Write the reader copy of a notebook page for the website; its path relative to the site, or None.

    The copy (``_notebooks/<page>.ipynb``) has the glued values, citation
    labels and equation numbers of this build.
    """
    env = app.env
    source = Path(env.doc2path(pagename))
    if source.suffix != ".ipynb" or not source.exists():
        return None
    nb = json.loads(source.read_text(encoding="utf8"))
    config = getattr(env, "mystnb_config", None)
    folder = Path(getattr(config, "output_folder", None) or Path(app.outdir).parent / "jupyter_execute")
    labels = {}
    if "cite" in env.domains:  # the labels of the website's bibliography, in its order
        for citation in env.get_domain("cite").citations:
            labels.setdefault(citation.key, citation.formatted_entry.label)
    bibs = [Path(app.srcdir) / bib for bib in getattr(app.config, "bibtex_bibfiles", None) or []]
    if not labels:
        for bib in bibs:
            labels.update(bib_labels(bib))
    references = {}
    for bib in bibs:
        references.update(bib_references(bib))
    std = env.get_domain("std")
    refs = {name: title for name, (_, _, title) in getattr(std, "labels", {}).items() if title}
    refs.update({doc: node.astext() for doc, node in getattr(env, "titles", {}).items()})
    copy_nb = reader_notebook(nb, glue=glue_values(folder / f"{pagename}.glue.json"), labels=labels,
                              equations=_site_equations(env, pagename, page_equations(nb)), refs=refs,
                              references=references)
    name = f"_notebooks/{pagename}.ipynb"
    target = Path(app.outdir) / name
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(copy_nb, indent=1, ensure_ascii=False) + "\n", encoding="utf8")
    return name


# --- Command line --------------------------------------------------------------------------------------------

def main(argv=None) -> int:
    """Write reader copies of notebooks (default: every chapter) with the book's labels and numbers."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="notebooks (default: chapters/*.ipynb)")
    parser.add_argument("-o", "--out", type=Path, default=ROOT / "_build" / "reader", help="output folder")
    parser.add_argument("--glue-dir", type=Path, default=ROOT / "_build" / "jupyter_execute",
                        help="myst-nb's folder of executed notebooks and glue files")
    args = parser.parse_args(argv)
    notebooks = args.notebooks or sorted((ROOT / "chapters").glob("*.ipynb"))
    labels = bib_labels(ROOT / "book" / "references.bib")
    references = bib_references(ROOT / "book" / "references.bib")
    numbers = book_equation_numbers(ROOT / "_toc.yml")
    args.out.mkdir(parents=True, exist_ok=True)
    for path in notebooks:
        path = path.resolve()
        page = path.relative_to(ROOT).with_suffix("").as_posix() if path.is_relative_to(ROOT) else path.stem
        nb = json.loads(path.read_text(encoding="utf8"))
        result = reader_notebook(nb, glue=glue_values(args.glue_dir / f"{page}.glue.json"), labels=labels,
                                 equations=page_numbers(numbers, page) if page in numbers else None,
                                 references=references)
        target = args.out / path.name
        target.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n", encoding="utf8")
        print(target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
