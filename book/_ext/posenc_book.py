"""Sphinx extension for the book: serve plotly.js and MathJax from the site itself, link Colab.

* plotly.js is the official cartesian-only bundle vendored in ``vendor/``
  (the same major.minor version as the plotly.js of the ``plotly`` Python
  package, else that package's full bundle is used). Only pages with figures
  load it, deferred, so the text paints first; figures are emitted by
  ``posenc.viz``'s renderer as ``<div>`` + ``Plotly.newPlot`` calls that wait
  for it.
* ``static/posenc.css`` fits the pages to a phone (long code wraps, wide
  blocks scroll).
* Every executed notebook is offered for download, with its outputs, next to
  the clean one (the page's download menu), and so is a reader copy for
  JupyterLab and Colab, where MyST is not rendered (``book/reader_copy.py``).
* MathJax 3 comes from the ``sphinx-mathjax-offline`` package.

Both are copied into ``_static/vendor/`` so the site needs no network.

The book's repository URL is found where the book is published (see
``book/install_cells.py``): ``repository.url`` of ``_config.yml``, else
GitHub Actions' environment, else a GitHub ``origin`` remote. When it is
known, every chapter gets an "open in Colab" launch button and the header a
link to the repository.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import inspect
import json
import os
import re
import shutil
from importlib import metadata
from pathlib import Path

import plotly
from docutils import nodes
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

try:
    from sphinx.builders.html._assets import _JavaScript
except ImportError:  # Sphinx < 7.2
    from sphinx.builders.html import JavaScript as _JavaScript

logger = logging.getLogger(__name__)
HERE = Path(__file__).resolve().parent
FULL_PLOTLY_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
CARTESIAN_PLOTLY_JS = HERE / "vendor" / "plotly-cartesian.min.js"
VENDOR = "vendor"
EXECUTED = "_executed"  # executed notebooks, for download


def plotly_js_version(path: Path) -> str:
    """The version in the header of a plotly.js bundle (``"4.1.1"``)."""
    with open(path, encoding="utf8") as f:
        head = f.read(300)
    match = re.search(r"plotly\.js .*?v(\d+\.\d+\.\d+)", head)
    if not match:
        raise ValueError(f"no plotly.js version in the header of {path}")
    return match.group(1)


def _minor(version: str) -> tuple:
    return tuple(version.split(".")[:2])


def plotly_js() -> Path:
    """The cartesian bundle when it matches the Python package's plotly.js, else the full bundle."""
    if CARTESIAN_PLOTLY_JS.exists() and (
        _minor(plotly_js_version(CARTESIAN_PLOTLY_JS)) == _minor(plotly_js_version(FULL_PLOTLY_JS))
    ):
        return CARTESIAN_PLOTLY_JS
    logger.warning(f"{CARTESIAN_PLOTLY_JS.name} does not match plotly.js "
                   f"{plotly_js_version(FULL_PLOTLY_JS)} of the plotly package; using the full bundle "
                   "(see book/_ext/vendor/README.md)")
    return FULL_PLOTLY_JS


PLOTLY_JS = plotly_js()


def _mathjax_dir() -> Path:
    dist = metadata.distribution("sphinx-mathjax-offline")
    return Path(dist.locate_file("sphinx-mathjax-offline/static/mathjax"))


LIBRARY = HERE.parents[1] / "src" / "lib"  # posenc's sources in this checkout


def library_digest(library: Path = LIBRARY) -> str:
    """The first 12 hex digits of the SHA-256 of every file of the library (``src/lib``, caches left out)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in Path(library).rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        digest.update(path.relative_to(library).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def execution_cache_name(name: str, environ=os.environ, library: Path = LIBRARY) -> str:
    """The execution cache's folder name for this build's environment.

    Executed notebooks depend on the running mode, the seeds (``POSENC_SEED``),
    PyTorch's CPU kernels (``ATEN_CPU_CAPABILITY``) and the library's code, none
    of which jupyter-cache sees (it keys a notebook by its cells): one cache
    per combination, so that a build never shows the outputs of another (an
    edit to ``posenc`` executes every notebook again, and switching back
    reuses the earlier cache).
    """
    mode = environ.get("POSENC_SIZE", "").strip().lower() or "auto"
    parts = [name, mode, f"lib{library_digest(library)}"]
    seed = environ.get("POSENC_SEED", "").strip()
    if seed and seed != "0":
        parts.append(f"seed{seed}")
    kernels = environ.get("ATEN_CPU_CAPABILITY", "").strip().lower()
    if kernels:
        parts.append(kernels)
    return "-".join(re.sub(r"[^A-Za-z0-9_.]", "_", part) for part in parts)


def _set_paths(app, config) -> None:
    config.mathjax_path = f"{VENDOR}/mathjax/tex-chtml.js"
    cache = Path(config.nb_execution_cache_path or Path(app.outdir).parent / ".jupyter_cache")
    config.nb_execution_cache_path = str(cache.with_name(execution_cache_name(cache.name)))


COLAB_URL = "https://colab.research.google.com"
#: The branch the publishing workflow (.github/workflows/ci.yml) fills with the reader copies
#: (``_build/html/_notebooks``): Colab opens notebooks from GitHub, so its button opens them there.
READER_BRANCH = "reader-notebooks"
_COLAB_GITHUB = re.compile(r"^(?P<repo>https://[^/]+/github/[^/]+/[^/]+)/blob/[^/]+/.+\.ipynb$")


@functools.lru_cache(maxsize=None)
def _book_module(name: str):
    """The module ``book/<name>.py``, loaded once (book/ is not a package)."""
    path = Path(__file__).resolve().parents[1] / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"posenc_book_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _install_cells():
    """``book/install_cells.py``, the one place the repository URL is discovered."""
    return _book_module("install_cells")


def _colab_button(app, config) -> None:
    # A Colab launch button needs the book's own repository: without one, Jupyter
    # Book would link every chapter to its own project. Show it only when known.
    install_cells = _install_cells()
    options = dict(config.html_theme_options or {})
    url = str(options.get("repository_url") or "").strip().rstrip("/")
    if not url or url == install_cells.JUPYTER_BOOK_DEFAULT_REPOSITORY:
        url = install_cells.repository_url(Path(app.srcdir) / "_config.yml", root=Path(app.srcdir))
    launch = dict(options.get("launch_buttons") or {})
    if url:
        options["repository_url"] = url
        options["use_repository_button"] = True
        launch["colab_url"] = launch.get("colab_url") or COLAB_URL
    else:
        options["repository_url"] = ""
        launch["colab_url"] = ""
    options["launch_buttons"] = launch
    config.html_theme_options = options


def _copy_assets(app, exception) -> None:
    if exception is not None or app.builder.format != "html":
        return
    target = Path(app.outdir) / "_static" / VENDOR
    target.mkdir(parents=True, exist_ok=True)
    shutil.copy2(PLOTLY_JS, target / "plotly.min.js")
    shutil.copytree(_mathjax_dir(), target / "mathjax", dirs_exist_ok=True)


def _static_path(app, config) -> None:
    config.html_static_path = [*config.html_static_path, str(HERE / "static")]


def _plotly_where_needed(app, pagename, templatename, context, doctree) -> None:
    # plotly.js (1.5 MB) only on pages with figures, deferred: the text paints
    # first, and the figures' scripts draw once it has run (before DOMContentLoaded).
    # MathJax (1.2 MB) only on pages with math.
    body = context.get("body") or ""
    scripts = context.setdefault("script_files", [])
    if 'class="math' not in body:
        scripts[:] = [s for s in scripts if "mathjax" not in str(getattr(s, "filename", s) or "")]
    if "plotly-graph-div" in body:
        scripts.append(_JavaScript(f"_static/{VENDOR}/plotly.min.js", priority=100, defer="defer"))


_FONTAWESOME_JS = re.compile(r'\s*<(?:script defer|link rel="preload" as="script")[^>]*scripts/fontawesome\.js[^>]*>(?:</script>)?')
_SEARCH_INDEX = re.compile(r'<script src="([^"]*)searchindex\.js"></script>')
_LAZY_SEARCH_INDEX = (  # the index (120 kB) is fetched when a search box gets the focus
    '<script>document.addEventListener("focusin", function load(e) {{'
    ' if (!e.target.matches || !e.target.matches("input[type=search], input[name=q]")) return;'
    ' document.removeEventListener("focusin", load); var s = document.createElement("script");'
    ' s.src = "{}searchindex.js"; document.head.appendChild(s); }});</script>')


def _lighten_pages(app, exception) -> None:
    # The theme's icons are drawn by its CSS web font; its Font Awesome script (1.5 MB,
    # on every page) only redraws them as SVG: left out. The search index is loaded
    # when it is needed, not by every page.
    if exception is not None or app.builder.format != "html":
        return
    for page in Path(app.outdir).rglob("*.html"):
        if "_static" in page.relative_to(app.outdir).parts:
            continue
        html = page.read_text(encoding="utf8")
        light = _FONTAWESOME_JS.sub("", html)
        if page.name != "search.html":
            light = _SEARCH_INDEX.sub(lambda m: _LAZY_SEARCH_INDEX.format(m.group(1)), light)
        if light != html:
            page.write_text(light, encoding="utf8")


_FIGURE_CALL = re.compile(r'posencPlot\("posenc-[0-9a-f]+", ')


def with_plotly_json(notebook: str) -> str:
    """An executed notebook whose figures also carry plotly's JSON.

    The website build emits figures as HTML only (``posenc.viz``); JupyterLab and
    VS Code draw plotly's own mime type, rebuilt here from the figure in the HTML.
    """
    nb = json.loads(notebook)
    decoder = json.JSONDecoder()
    for cell in nb.get("cells", []):
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            html = data.get("text/html")
            html = "".join(html) if isinstance(html, list) else html
            match = _FIGURE_CALL.search(html or "")
            if match and "application/vnd.plotly.v1+json" not in data:
                figure, _ = decoder.raw_decode(html, match.end())
                data["application/vnd.plotly.v1+json"] = {"data": figure.get("data", []),
                                                          "layout": figure.get("layout", {}), "config": {}}
    return json.dumps(nb, indent=1, ensure_ascii=False) + "\n"


def _has_outputs(notebook: dict) -> bool:
    return any(c.get("outputs") for c in notebook.get("cells", []) if c.get("cell_type") == "code")


def _with_cached_outputs(app, text: str):
    """The notebook ``text`` with its outputs, or None if no outputs can be found.

    myst-nb writes the notebook it executed to ``jupyter_execute/``, but when a
    page's outputs come from the execution cache it writes the notebook as read,
    without them; they are then merged here from the same cache.
    """
    if _has_outputs(json.loads(text)):
        return text
    config = getattr(app.env, "mystnb_config", None)
    cache_path = getattr(config, "execution_cache_path", None)
    if not cache_path or not Path(cache_path).exists():
        return None
    import nbformat
    from jupyter_cache import get_cache

    try:
        _, merged = get_cache(cache_path).merge_match_into_notebook(nbformat.reads(text, as_version=4))
    except KeyError:  # no cached execution of these cells
        return None
    merged_text = nbformat.writes(merged)
    return merged_text if _has_outputs(json.loads(merged_text)) else None


def _executed_download(app, pagename, templatename, context, doctree) -> None:
    # The notebook as executed by this build (myst-nb writes it beside the site),
    # offered in the page's download menu next to the clean one.
    executed = Path(app.outdir).parent / "jupyter_execute" / f"{pagename}.ipynb"
    if not executed.exists():
        return
    text = _with_cached_outputs(app, executed.read_text(encoding="utf8"))
    if text is None:
        return  # never offer a notebook "with outputs" that has none
    name = f"{EXECUTED}/{pagename}-with-outputs.ipynb"
    target = Path(app.outdir) / name
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(with_plotly_json(text), encoding="utf8")
    for group in context.get("header_buttons") or []:
        if group.get("label") == "download-buttons":
            clean = [i for i, b in enumerate(group["buttons"])
                     if b.get("label") in ("download-notebook-button", "download-source-button")]
            group["buttons"].insert(clean[0] + 1 if clean else 0, {
                "type": "link",
                "url": context["pathto"](name, 1),
                "text": ".ipynb with outputs",
                "icon": "fas fa-book-open",
                "tooltip": "Download the notebook as executed for this page, with its outputs",
                "label": "download-executed-notebook-button",
            })


def _drop_removed_pages(app, exception) -> None:
    # Sphinx never deletes the output of a page whose source is gone (a renamed chapter): its HTML,
    # executed notebook and reader copy would stay on the site, and its claims on the ledger's checks.
    if exception is not None or app.builder.format != "html":
        return
    out, docs = Path(app.outdir), set(app.env.found_docs)
    stale = [(path, path.relative_to(out / folder).as_posix().removesuffix(suffix))
             for folder, suffix in ((EXECUTED, "-with-outputs.ipynb"), ("_notebooks", ".ipynb"))
             for path in (out / folder).rglob(f"*{suffix}")]
    stale += [(path, path.relative_to(out).as_posix().removesuffix(".html"))
              for folder in {doc.split("/")[0] for doc in docs if "/" in doc} for path in (out / folder).rglob("*.html")]
    for path, doc in stale:
        if doc not in docs:
            path.unlink()
            logger.info(f"removed {path.relative_to(out)}: its page {doc} is no longer in the book")


def _reader_copy():
    """``book/reader_copy.py``, which writes a notebook page's copy for JupyterLab and Colab."""
    return _book_module("reader_copy")


def _reader_download(app, pagename, templatename, context, doctree) -> None:
    # A copy of the page's notebook that reads well where MyST is not rendered
    # (solutions folded, citations, numbers and equation references written
    # out, with this build's values), in the download menu after the others.
    try:
        name = _reader_copy().site_copy(app, pagename)
    except Exception as err:  # the page itself does not depend on it
        logger.warning(f"no reader copy of {pagename}: {type(err).__name__}: {err}", location=pagename)
        return
    if name is None:
        return
    for group in context.get("header_buttons") or []:
        if group.get("label") == "download-buttons":
            before = [i for i, b in enumerate(group["buttons"]) if b.get("label") in (
                "download-notebook-button", "download-source-button", "download-executed-notebook-button")]
            group["buttons"].insert(before[-1] + 1 if before else 0, {
                "type": "link",
                "url": context["pathto"](name, 1),
                "text": ".ipynb for Jupyter / Colab",
                "icon": "fas fa-book-reader",
                "tooltip": "Download the notebook written for JupyterLab and Colab: solutions folded, "
                           "citations, equation numbers and this page's numbers written out",
                "label": "download-reader-notebook-button",
            })
    _colab_opens_reader_copy(context.get("header_buttons") or [], name)


def _colab_opens_reader_copy(groups, name: str) -> None:
    """Point the Colab launch button at the reader copy ``name`` (``_notebooks/<page>.ipynb``) on READER_BRANCH.

    The theme's button opens the page's source notebook, whose MyST Colab does not
    render (solutions open, raw roles); the reader copy is written for it.
    """
    for group in groups:
        for button in group.get("buttons") or []:
            match = _COLAB_GITHUB.match(str(button.get("url") or ""))
            if match and button.get("text") == "Colab":
                path = name.split("/", 1)[1] if name.startswith("_notebooks/") else name
                button["url"] = f"{match['repo']}/blob/{READER_BRANCH}/{path}"
                button["tooltip"] = "Open in Colab (the notebook written for it: solutions folded)"


def _write_redirect(app, exception) -> None:
    # The site's index.html sends the reader to the first page. sphinx-external-toc
    # writes it as a bare <meta> refresh when it is missing; without a declared icon
    # the browser then asks for /favicon.ico, a 404 console error. Write it first,
    # complete, from the configuration (so a changed root page is followed too).
    if exception is not None or app.builder.format != "html" or app.config.root_doc == "index":
        return
    first = f"{app.config.root_doc}.html"
    favicon = app.config.html_favicon
    icon = f'<link rel="icon" href="_static/{Path(favicon).name}">\n' if favicon else ""
    (Path(app.outdir) / "index.html").write_text(
        f'<!DOCTYPE html>\n<meta charset="utf-8">\n<title>{app.config.html_title}</title>\n{icon}'
        f'<meta http-equiv="Refresh" content="0; url={first}">\n',
        encoding="utf8",
    )


def _dedupe_scripts(app, pagename, templatename, context, doctree) -> None:
    # sphinx-thebe registers an inline `const THEBE_JS_URL = ...` script, which
    # Sphinx 7.4 lists twice (once with filename None, once with ''): browsers
    # then report a redeclaration error. Keep the first copy of every script.
    scripts = context.get("script_files")
    if not scripts:
        return
    seen, unique = set(), []
    for script in scripts:
        key = (str(getattr(script, "filename", script) or ""),
               tuple(sorted(getattr(script, "attributes", {}).items())))
        if key not in seen:
            seen.add(key)
            unique.append(script)
    context["script_files"] = unique


def _module_docstring(app, what, name, obj, options, lines):
    """The API page shows a callable module (``posenc.train``) with its own docstring, not the one ``help()`` reads."""
    own = getattr(obj, "__module_doc__", None) if what == "module" else None
    if own is not None:
        lines[:] = inspect.cleandoc(own).splitlines()


# --- The claims ledger ---------------------------------------------------------
# Every claim a chapter re-tests is recorded there with ``pe.claim``, which leaves the entry in the
# cell's output (posenc.ledger). The "Claims re-tested" page (book/claims.md) places a
# ``{claims-ledger}`` directive; once every page has been read (and every notebook executed into the
# cache), the directive's node becomes the table of all entries, read back from the executed notebooks.


class claims_ledger(nodes.General, nodes.Element):
    """Where the ledger's table goes (filled in at ``doctree-resolved``)."""


def _ledger_notebooks(app) -> list:
    """``(docname, path)`` of the notebooks of the table of contents, in its order."""
    srcdir = Path(app.srcdir)
    paths = _book_module("execute").book_notebooks()
    return [(p.relative_to(srcdir).with_suffix("").as_posix(), p) for p in paths if p.is_relative_to(srcdir)]


class ClaimsLedgerDirective(SphinxDirective):
    """``{claims-ledger}``: the table of every claim the chapters record with ``pe.claim``."""

    has_content = False

    def run(self):
        for _, path in _ledger_notebooks(self.env.app):
            self.env.note_dependency(str(path))  # a changed chapter rebuilds the ledger's page
        return [claims_ledger()]


OUTCOME_CLASS = {"reproduced": "reproduced", "partially reproduced": "partial", "not reproduced": "not-reproduced",
                 "within seed noise": "noise", "not tested here": "untested"}


def ledger_entries(app, location: str) -> list:
    """``[(docname, [Claim, ...]), ...]`` from the executed notebooks, in the order of the table of contents.

    A notebook without executed outputs in the cache, or whose entries cannot be read, is a warning (an error
    with ``-W``): the ledger is never silently short.
    """
    from posenc.ledger import entries_in_notebook

    found, seen = [], {}
    for docname, path in _ledger_notebooks(app):
        text = _with_cached_outputs(app, path.read_text(encoding="utf8"))
        if text is None:
            logger.warning(f"claims ledger: {docname} has no executed outputs in the execution cache, so its claims "
                           "are missing; execute it (make book, or book/execute.py) and build again", location=location)
            continue
        try:
            entries = entries_in_notebook(json.loads(text))
        except ValueError as err:
            logger.warning(f"claims ledger: {docname}: {err}", location=location)
            continue
        for entry in entries:
            if entry.key in seen:
                logger.warning(f"claims ledger: claim {entry.key!r} is recorded in {seen[entry.key]} and in {docname}",
                               location=location)
            seen[entry.key] = docname
        if entries:
            found.append((docname, entries))
    return found


def _anchor_ids(app, docname: str) -> set:
    doctree = app.env.get_doctree(docname)
    return {i for node in doctree.findall(nodes.Element) for i in node.get("ids", [])}


def _section_uri(app, fromdoc: str, docname: str, anchor: str, ids: set, location: str):
    labels = app.env.domaindata.get("std", {}).get("labels", {})
    if anchor in labels and labels[anchor][0] == docname:
        anchor = labels[anchor][1]
    elif anchor not in ids:
        logger.warning(f"claims ledger: {docname} has no section or label {anchor!r}", location=location)
        return None
    return f"{app.builder.get_relative_uri(fromdoc, docname)}#{anchor}"


def _text_cell(column: str, *children) -> nodes.entry:
    return nodes.entry("", nodes.paragraph("", "", *children), classes=[f"posenc-ledger-{column}"])


def _fill_claims_ledger(app, doctree, fromdoc) -> None:
    for node in list(doctree.findall(claims_ledger)):
        chapters = ledger_entries(app, fromdoc)
        citations = {c.key: c for c in app.env.get_domain("cite").citations}
        entries = [e for _, es in chapters for e in es]
        sources = {s for e in entries for s in e.source}
        outcomes = {o: sum(e.outcome == o for e in entries) for o in OUTCOME_CLASS}
        summary = nodes.paragraph("", "", nodes.strong("", f"{len(entries)} claims from {len(sources)} sources"),
                                  nodes.Text(f", tested in {len(chapters)} chapters: " + ", ".join(
                                      f"{n} {o}" for o, n in outcomes.items() if n) + "."),
                                  classes=["posenc-ledger-count"])
        out = [summary]
        for docname, chapter_entries in chapters:
            ids = _anchor_ids(app, docname)
            title = app.env.titles[docname].astext() if docname in app.env.titles else docname
            heading = nodes.reference("", title, internal=True, refuri=app.builder.get_relative_uri(fromdoc, docname))
            out.append(nodes.rubric("", "", heading, classes=["posenc-ledger-chapter"]))
            table = nodes.table(classes=["posenc-ledger-table", "colwidths-given"])
            group = nodes.tgroup(cols=4)
            table += group
            for width in (34, 14, 34, 18):
                group += nodes.colspec(colwidth=width)
            group += nodes.thead("", nodes.row("", *(nodes.entry("", nodes.paragraph(text=h)) for h in (
                "Claim (links to where it is tested)", "Source", "Measured here", "Verdict"))))
            body = nodes.tbody()
            group += body
            for entry in chapter_entries:
                uri = _section_uri(app, fromdoc, docname, entry.section, ids, fromdoc)
                claim = (nodes.reference("", entry.claim, internal=True, refuri=uri) if uri
                         else nodes.Text(entry.claim))
                cites = []
                for key in entry.source:
                    if key not in citations:
                        logger.warning(f"claims ledger: claim {entry.key!r} cites {key!r}, which is not in the "
                                       "bibliography (book/references.bib)", location=fromdoc)
                        cites.append(nodes.Text(key))
                        continue
                    c = citations[key]
                    target = f"{app.builder.get_relative_uri(fromdoc, c.bibliography_key.docname)}#{c.citation_id}"
                    cites.append(nodes.reference("", f"[{c.formatted_entry.label}]", internal=True, refuri=target))
                joined = [part for i, ref in enumerate(cites) for part in ((nodes.Text(", "),) if i else ()) + (ref,)]
                verdict = nodes.inline("", entry.verdict, classes=["posenc-verdict",
                                                                  f"posenc-verdict-{OUTCOME_CLASS[entry.outcome]}"])
                row = nodes.row("", _text_cell("claim", claim), _text_cell("source", *joined),
                                _text_cell("measured", nodes.Text(entry.measured)), _text_cell("verdict", verdict),
                                ids=[f"claim-{entry.key}"])
                body += row
            out.append(nodes.container("", table, classes=["posenc-ledger"]))
        node.replace_self(out)


def setup(app):
    for path in (PLOTLY_JS, _mathjax_dir()):
        if not path.exists():
            raise RuntimeError(f"offline asset missing: {path}; reinstall requirements.txt")
    app.connect("config-inited", _set_paths)
    app.connect("config-inited", _colab_button)
    app.connect("config-inited", _static_path)
    app.add_css_file("posenc.css")
    app.connect("html-page-context", _executed_download, priority=600)  # after the theme's buttons (501)
    app.connect("html-page-context", _reader_download, priority=600)  # after the executed notebook's
    app.connect("html-page-context", _plotly_where_needed, priority=800)
    app.connect("build-finished", _copy_assets)
    app.connect("build-finished", _drop_removed_pages)
    app.connect("autodoc-process-docstring", _module_docstring)
    app.connect("build-finished", _lighten_pages)
    app.connect("build-finished", _write_redirect, priority=400)  # before sphinx-external-toc's (500)
    app.connect("html-page-context", _dedupe_scripts, priority=900)
    app.add_node(claims_ledger)
    app.add_directive("claims-ledger", ClaimsLedgerDirective)
    app.connect("doctree-resolved", _fill_claims_ledger)
    return {"parallel_read_safe": True, "parallel_write_safe": True}


# --- Bibliography style --------------------------------------------------------
# The text cites "[Press et al., 2022]" (``bibtex_reference_style: label`` with these labels);
# the list uses the same author–year labels (style "posenc", set as
# ``bibtex_default_style`` in _config.yml) and links each title to its paper.

import pybtex.plugin
from pybtex.richtext import Text
from pybtex.style.formatting.plain import Style as _PlainStyle
from pybtex.style.labels import BaseLabelStyle
from pybtex.style.template import href, join, optional, words


def _cache_plugin_lookups() -> None:
    """pybtex finds its plugins in the installed packages' metadata at every use: one scan of every
    package's entry points (milliseconds), a few for each author name the labels render, about 650 in
    a build. What is installed does not change during a build: each selection is scanned once."""
    scan = pybtex.plugin.entry_points
    if not hasattr(scan, "cache_info"):  # not when this file is imported a second time, under another name
        pybtex.plugin.entry_points = functools.lru_cache(maxsize=None)(lambda **selection: tuple(scan(**selection)))


_cache_plugin_lookups()


def _last_name(person) -> str:
    name = " ".join(person.prelast_names + person.last_names)
    return Text.from_latex(name).render_as("text")


class AuthorYearLabelStyle(BaseLabelStyle):
    """Labels like ``Press et al., 2022``, ``Chiang and Cholak, 2022``, ``Su, 2021a``."""

    def format_label(self, entry) -> str:
        persons = entry.persons.get("author") or entry.persons.get("editor") or []
        names = [_last_name(p) for p in persons if str(p) != "others"]
        if not names:
            author = entry.key
        elif len(names) == 1 and len(persons) == 1:
            author = names[0]
        elif len(names) == 2 and len(persons) == 2:
            author = f"{names[0]} and {names[1]}"
        else:
            author = f"{names[0]} et al."
        year = entry.fields.get("year", "")
        return f"{author}, {year}" if year else author

    def format_labels(self, sorted_entries):
        labels = [self.format_label(entry) for entry in sorted_entries]
        total, seen = {}, {}
        for label in labels:
            total[label] = total.get(label, 0) + 1
        for label in labels:
            if total[label] == 1:
                yield label
            else:
                yield label + chr(ord("a") + seen.get(label, 0))
                seen[label] = seen.get(label, 0) + 1


def entry_url(entry) -> str | None:
    """The link of an entry: its ``url``, else its arXiv ``eprint``, else its ``doi``."""
    fields = entry.fields
    if fields.get("url"):
        return str(fields["url"])
    if fields.get("eprint"):
        return f"https://arxiv.org/abs/{fields['eprint']}"
    if fields.get("doi"):
        return f"https://doi.org/{fields['doi']}"
    return None


class PosencStyle(_PlainStyle):
    """pybtex ``plain`` with author–year labels and titles linked to the paper."""

    default_label_style = "authoryear"

    def format_title(self, e, which_field, as_sentence=True):
        title = super().format_title(e, which_field, as_sentence=as_sentence)
        url = entry_url(e)
        return href(url)[title] if url else title

    def format_web_refs(self, e):
        # The title already links to ``url``; show the URL itself only when
        # there is no arXiv id or DOI to show instead.
        if "eprint" in e.fields or "doi" in e.fields:
            return join(sep=", ")[
                optional[self.format_eprint(e)],
                optional[self.format_doi(e)],
            ]
        return optional[words["URL:", self.format_url(e)]] if "url" in e.fields else join[""]

    def format_url(self, e):
        url = str(e.fields["url"])
        return href(url)[url]


def register_bibtex_style() -> None:
    """Register the ``authoryear`` label style and the ``posenc`` formatting style."""
    for group, name, cls in (
        ("pybtex.style.labels", "authoryear", AuthorYearLabelStyle),
        ("pybtex.style.formatting", "posenc", PosencStyle),
    ):
        try:
            pybtex.plugin.find_plugin(group, name)
        except pybtex.plugin.PluginNotFound:
            pybtex.plugin.register_plugin(group, name, cls)


register_bibtex_style()
