"""Browser tests of the built website, in headless Chromium (Debian's package).

Run after `make book`; they are skipped when the site or Chromium is missing,
unless POSENC_REQUIRE_SITE=1 (as in `make test-site` and CI), where that fails.
No request may leave the machine: plotly.js, MathJax and fonts are local.
"""

from __future__ import annotations

import functools
import gzip
import http.server
import io
import os
import re
import shutil
import threading
from pathlib import Path
from urllib.parse import urlparse

import pytest

SITE = Path(__file__).resolve().parent.parent / "_build" / "html"
REQUIRED = os.environ.get("POSENC_REQUIRE_SITE", "") not in ("", "0")
CHROMIUM = os.environ.get("CHROMIUM", shutil.which("chromium") or "/usr/bin/chromium")


def _missing(reason):
    if REQUIRED:
        pytest.fail(reason)
    pytest.skip(reason)


PAGES = sorted(
    p.relative_to(SITE).as_posix()
    for p in SITE.rglob("*.html")
    if not {"_static", "_sources", "_images"} & set(p.relative_to(SITE).parts)
) if SITE.exists() else []
CHAPTERS = [p for p in PAGES if p.startswith("chapters/")]


@pytest.fixture(scope="module")
def server():
    if not (SITE / "index.html").exists():
        _missing(f"no built site at {SITE}: run `make book` first")
    handler = functools.partial(_QuietHandler, directory=str(SITE))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    """Serves the site as static hosts do (GitHub Pages, Netlify, nginx's gzip_static): text gzip-compressed."""

    COMPRESSED = (".html", ".js", ".css", ".svg", ".json", ".ipynb", ".txt", ".map")
    _cache: dict = {}

    def log_message(self, *args):
        pass

    def send_head(self):
        path = Path(self.translate_path(self.path))
        if (not path.is_file() or not path.name.endswith(self.COMPRESSED)
                or "gzip" not in self.headers.get("Accept-Encoding", "")):
            return super().send_head()
        if path not in self._cache:
            self._cache[path] = gzip.compress(path.read_bytes(), compresslevel=6)
        body = self._cache[path]
        self.send_response(200)
        self.send_header("Content-Type", self.guess_type(str(path)))
        self.send_header("Content-Encoding", "gzip")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        return io.BytesIO(body)


@pytest.fixture(scope="module")
def browser():
    playwright = pytest.importorskip("playwright.sync_api")
    if not Path(CHROMIUM).exists():
        _missing(f"Chromium not found at {CHROMIUM} (Debian: apt-get install chromium)")
    with playwright.sync_playwright() as p:
        b = p.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"],
        )
        yield b
        b.close()


class Visit:
    """A page opened in a fresh context, with its console errors and outside requests."""

    def __init__(self, browser, server, path, viewport=(1280, 900)):
        self.context = browser.new_context(viewport={"width": viewport[0], "height": viewport[1]})
        self.page = self.context.new_page()
        self.errors, self.outside = [], []
        self.page.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))

        def route(r):
            host = urlparse(r.request.url).hostname
            if r.request.url.startswith(("data:", "blob:")) or host == "127.0.0.1":
                return r.continue_()
            self.outside.append(r.request.url)
            return r.abort()

        self.page.route("**/*", route)
        self.page.goto(f"{server}/{path}", wait_until="load")
        self.page.wait_for_timeout(300)

    def close(self):
        self.context.close()


@pytest.fixture
def visit(browser, server):
    opened = []

    def _open(path, viewport=(1280, 900)):
        v = Visit(browser, server, path, viewport)
        opened.append(v)
        return v

    yield _open
    for v in opened:
        v.close()


def test_site_has_every_chapter():
    if not SITE.exists():
        _missing(f"no built site at {SITE}")
    toc = (SITE.parent.parent / "_toc.yml").read_text()
    for line in toc.splitlines():
        line = line.strip()
        if line.startswith("- file:"):
            page = line.split(":", 1)[1].strip() + ".html"
            assert page in PAGES, f"{page} missing from the built site"


@pytest.mark.parametrize("path", CHAPTERS or ["chapters/none.html"])
def test_tables_a_cell_displays_are_tables(path):
    """A table a code cell shows with IPython's ``Markdown`` is an HTML table on the page, not a paragraph of pipes.

    myst-nb renders ``text/markdown`` outputs as CommonMark by default, which has
    no tables; the book sets ``nb_render_markdown_format: gfm``.
    """
    if not (SITE / path).exists():
        _missing(f"no built page {path}")
    html = (SITE / path).read_text()
    raw = re.findall(r"<p>\|[^<]{0,80}", html)
    assert not raw, f"{path}: Markdown tables left as text: {raw[:2]}"


@pytest.mark.parametrize("path", PAGES or ["index.html"])
def test_no_role_reaches_a_page_as_text(path):
    """Every ``{glue:text}``, ``{cite}``, ... role was read by the build: none is left as literal text (a role
    inside math is not read, and the math after it comes out with its delimiters flipped)."""
    if not (SITE / path).exists():
        _missing(f"no built page {path}")
    text = re.sub(r"<(script|style|code|pre)\b.*?</\1>", "", (SITE / path).read_text(), flags=re.S)  # code shows roles
    left = re.findall(r"\{(?:glue|cite|numref|ref|doc|math)(?::[a-z]+)?\}`[^`<]{0,60}", re.sub(r"<[^>]+>", "", text))
    assert not left, f"{path}: roles left as text: {left[:3]}"


@pytest.mark.parametrize("path", PAGES or ["index.html"])
def test_page_loads_offline_without_errors(visit, path):
    v = visit(path)
    assert v.page.title()
    # Without a declared icon the browser asks for /favicon.ico, a 404 reported as a console error
    # after this test has stopped listening. Read the file: a redirect page is gone from the DOM by now.
    assert re.search(r"<link[^>]*\brel=\"icon\"", (SITE / path).read_text()), f"{path} declares no icon"
    assert v.errors == [], f"console errors on {path}: {v.errors}"
    assert v.outside == [], f"{path} asked the network for {v.outside}"


@pytest.mark.parametrize("path", CHAPTERS or ["chapters/none.html"])
def test_chapter_figures_render_and_math_typesets(visit, path):
    v = visit(path)
    page = v.page
    divs = page.locator("div.plotly-graph-div")
    assert divs.count() >= 1, f"{path} has no plotly figure"
    page.wait_for_function(
        "() => [...document.querySelectorAll('div.plotly-graph-div')]"
        ".every(d => d._fullLayout && d.querySelector('svg.main-svg'))",
        timeout=20000,
    )
    if page.locator(".math").count():
        page.wait_for_selector("mjx-container", state="attached", timeout=20000)


@pytest.mark.parametrize("path", CHAPTERS or ["chapters/none.html"])
def test_chapter_sliders_move_and_change_the_figure(visit, path):
    v = visit(path)
    page = v.page
    page.wait_for_function(
        "() => [...document.querySelectorAll('div.plotly-graph-div')].every(d => d._fullLayout)",
        timeout=20000,
    )
    n_sliders = page.evaluate(
        "() => [...document.querySelectorAll('div.plotly-graph-div')]"
        ".filter(d => (d.layout.sliders || []).length).length"
    )
    assert n_sliders >= 1, f"{path} has no figure with a slider"
    for index in range(n_sliders):
        state = (
            "(i) => { const d = [...document.querySelectorAll('div.plotly-graph-div')]"
            ".filter(d => (d.layout.sliders || []).length)[i];"
            " return {active: d.layout.sliders[0].active || 0, steps: d.layout.sliders[0].steps.length,"
            " visible: d.data.map(t => t.visible !== false)}; }"
        )
        before = page.evaluate(state, index)
        rail = page.locator("div.plotly-graph-div:has(g.slider-container) g.slider-rail-rect,"
                            " div.plotly-graph-div:has(g.slider-container) rect.slider-rail-rect").nth(index)
        rail.scroll_into_view_if_needed()
        box = rail.bounding_box()
        target = 0.02 if before["active"] >= before["steps"] // 2 else 0.98
        page.mouse.click(box["x"] + target * box["width"], box["y"] + box["height"] / 2)
        page.wait_for_timeout(200)
        after = page.evaluate(state, index)
        assert after["active"] != before["active"], f"slider {index} on {path} did not move"
        assert after["visible"] != before["visible"], f"slider {index} on {path} did not change the figure"
    assert v.errors == []


EXERCISE_CHAPTERS = [p for p in CHAPTERS if "appendix" not in p]


@pytest.mark.parametrize("path", EXERCISE_CHAPTERS or ["chapters/none.html"])
def test_exercise_answers_stay_hidden_until_the_solution_is_opened(visit, path):
    """A checked answer ("✓ 1.2: correct ...") and the numbers a solution prints show only once opened."""
    page = visit(path).page
    answers = page.get_by_text(re.compile(r"✓ \d+\.\d+: correct"))
    assert answers.count() >= 1, f"{path} shows no checked answer at all"
    shown = [answers.nth(i).inner_text()[:60] for i in range(answers.count()) if answers.nth(i).is_visible()]
    assert shown == [], f"{path} shows answers before any solution is opened: {shown}"
    toggles = page.locator("div.tag_hide-cell summary")
    assert toggles.count() >= answers.count()
    for i in range(toggles.count()):
        toggles.nth(i).scroll_into_view_if_needed()
        toggles.nth(i).click()
    page.wait_for_timeout(200)
    assert all(answers.nth(i).is_visible() for i in range(answers.count())), f"{path}: an answer does not open"


# --- Every screen, light and fast ---------------------------------------------------------------------------

PHONE, DESKTOP = (390, 844), (1366, 900)
TEXT_ONLY_BYTES, CHAPTER_BYTES, FIRST_PAINT_MS = 1_000_000, 2_500_000, 1500
BLOCKING_BYTES = 400_000  # stylesheets and scripts the first paint waits for, on the wire
# On a busy machine (the other test worker training models on the same cores) a page's first paint can be late
# for reasons outside the page. It then passes when its best paint is within PAINT_RATIO times the best of
# REFERENCE_PAGE, loaded just before each of its loads: the theme's own stylesheets, scripts and fonts with almost
# no content, so what the page adds to the theme is measured under the same load.
REFERENCE_PAGE, PAINT_RATIO = "genindex.html", 2.0

_FIGURES_DRAWN = ("() => [...document.querySelectorAll('div.plotly-graph-div')]"
                  ".every(d => d._fullLayout && d.querySelector('svg.main-svg'))")


@pytest.mark.parametrize("path", PAGES or ["index.html"])
def test_no_page_is_wider_than_a_phone(visit, path):
    v = visit(path, PHONE)
    v.page.wait_for_function(_FIGURES_DRAWN, timeout=20000)
    v.page.wait_for_timeout(300)
    wide = v.page.evaluate(
        """() => [...document.querySelectorAll('body *')].filter(e => {
                 const r = e.getBoundingClientRect(); if (!r.width || r.right <= innerWidth + 1) return false;
                 for (let p = e.parentElement; p; p = p.parentElement) {   // inside a scrolling box: fine
                     const o = getComputedStyle(p).overflowX;
                     if ((o === 'auto' || o === 'scroll' || o === 'hidden') && p.getBoundingClientRect().right <= innerWidth + 1)
                         return false;
                 }
                 return getComputedStyle(e).visibility !== 'hidden';
             }).slice(0, 5).map(e => e.tagName + '.' + e.className + ': ' + (e.textContent || '').slice(0, 40))""")
    width = v.page.evaluate("() => document.documentElement.scrollWidth")
    assert width <= PHONE[0] and wide == [], f"{path} is {width} px wide on a phone: {wide}"
    assert v.errors == []


@pytest.mark.parametrize("path", CHAPTERS or ["chapters/none.html"])
def test_printed_tables_of_up_to_six_columns_fit_a_phone(visit, path):
    """Tables a cell prints (claims, verdicts, summaries) with six columns or fewer need no sideways scrolling."""
    v = visit(path, PHONE)
    wide = v.page.evaluate(
        """() => [...document.querySelectorAll('.cell_output table')]
                 .filter(t => t.rows.length && t.rows[0].cells.length <= 6 && t.scrollWidth > t.parentElement.clientWidth + 1)
                 .map(t => `${t.rows[0].cells.length} columns, ${t.scrollWidth} px in ${t.parentElement.clientWidth}: `
                           + t.rows[0].textContent.trim().slice(0, 60))""")
    assert wide == [], f"{path}: {wide}"


@pytest.mark.parametrize("path", CHAPTERS or ["chapters/none.html"])
def test_figures_fit_a_phone(visit, path):
    """At 390 px: plot areas >= 250 px, slider rails >= 200 px, titles inside their figure, no mode bar."""
    v = visit(path, PHONE)
    page = v.page
    page.wait_for_function(_FIGURES_DRAWN, timeout=20000)
    page.wait_for_timeout(500)
    figures = page.evaluate(
        """() => [...document.querySelectorAll('div.plotly-graph-div')].map(d => {
                 const box = d.getBoundingClientRect(), title = d.querySelector('g.g-gtitle text');
                 const t = title ? title.getBoundingClientRect() : null;
                 const bar = d.querySelector('.modebar');
                 return {width: box.width, plot: d._fullLayout._size.w,
                         rails: [...d.querySelectorAll('rect.slider-rail-rect')].map(r => r.getBoundingClientRect().width),
                         title: t ? [t.left - box.left, box.right - t.right] : null,
                         modebar: !!(bar && bar.getBoundingClientRect().width),
                         text: title ? title.textContent.slice(0, 40) : ''};
             })""")
    assert figures
    for index, f in enumerate(figures):
        where = f"{path}, figure {index} ({f['text']!r})"
        assert f["plot"] >= 250, f"{where}: plot area {f['plot']:.0f} px wide in a {f['width']:.0f} px figure"
        assert all(r >= 200 for r in f["rails"]), f"{where}: slider rail {f['rails']} px"
        assert f["title"] is None or min(f["title"]) >= -1, f"{where}: title overflows its figure {f['title']}"
        assert not f["modebar"], f"{where}: mode bar shown on a phone"
    assert v.errors == []


def _weight_and_first_paint(page):
    """Bytes over the wire (gzip, as static hosts send them), bytes once decoded, first contentful paint (ms)."""
    return page.evaluate(
        """() => {
             const entries = [performance.getEntriesByType('navigation')[0], ...performance.getEntriesByType('resource')];
             const bytes = entries.reduce((sum, e) => sum + (e.transferSize || e.encodedBodySize || 0), 0);
             const decoded = entries.reduce((sum, e) => sum + (e.decodedBodySize || 0), 0);
             const fcp = performance.getEntriesByName('first-contentful-paint')[0];
             return {bytes, decoded, fcp: fcp ? fcp.startTime : null};
         }""")


def _fresh_first_paint(visit, path):
    """First contentful paint (ms) of a fresh load of ``path`` on the desktop viewport (None if it did not paint)."""
    v = visit(path, DESKTOP)
    try:
        return _weight_and_first_paint(v.page)["fcp"]
    finally:
        v.close()


def _paints_in_time(paints):
    """``paints``: (page, reference) first paints of each load. The page's best within the goal, or (the machine busy)
    within PAINT_RATIO times the reference's best, both measured under the same load."""
    page = [p for p, _ in paints if p is not None]
    reference = [r for _, r in paints if r is not None]
    return bool(page) and (min(page) <= FIRST_PAINT_MS or (bool(reference) and min(page) <= PAINT_RATIO * min(reference)))


def test_the_first_paint_rule_weighs_the_page_against_the_theme_under_the_same_load():
    """The rule of the paint check (no browser needed): the best load counts, the reference only on a busy machine."""
    assert _paints_in_time([(FIRST_PAINT_MS, None)])
    assert not _paints_in_time([(FIRST_PAINT_MS + 1, None)])            # late, and nothing says the machine is busy
    assert _paints_in_time([(3000, None), (FIRST_PAINT_MS - 1, 400)])  # one load in time is enough
    assert _paints_in_time([(3000, None), (1900, 1000)])               # busy: the theme alone took 1 s
    assert not _paints_in_time([(3000, None), (2500, 1000), (2100, 1200)])  # over twice the theme's best (1000)
    assert not _paints_in_time([(None, None), (None, 900)])            # never painted


@pytest.mark.parametrize("path", PAGES or ["index.html"])
def test_pages_are_light_and_paint_fast(visit, path):
    """Bytes on the wire (gzip, as static hosts serve the site) within the goals, first paint within 1.5 s (on a
    busy machine: within twice the theme's own), plotly.js only on pages with figures and never blocking the first paint."""
    v = visit(path, DESKTOP)
    page = v.page
    figures = page.locator("div.plotly-graph-div").count()
    if figures:
        page.wait_for_function(_FIGURES_DRAWN, timeout=20000)
    page.wait_for_timeout(500)
    measured = _weight_and_first_paint(page)
    limit = CHAPTER_BYTES if path.startswith("chapters/") else TEXT_ONLY_BYTES
    assert measured["bytes"] <= limit, (f"{path} loads {measured['bytes'] / 1e6:.2f} MB "
                                       f"({measured['decoded'] / 1e6:.2f} MB decoded; limit {limit / 1e6:g} MB)")
    if path != "index.html":  # the redirect page paints nothing of its own
        # First paint is a timing: on a loaded machine one load can be slow for reasons outside the page, so the
        # page passes when one of up to three fresh loads paints in time. What the page makes wait for the first
        # paint (stylesheets and scripts that block rendering) is checked on the first load, where timing plays no part.
        blocking = page.evaluate("() => performance.getEntriesByType('resource')"
                                 ".filter(e => e.renderBlockingStatus === 'blocking')"
                                 ".reduce((sum, e) => sum + (e.transferSize || e.encodedBodySize || 0), 0)")
        assert blocking <= BLOCKING_BYTES, f"{path}: {blocking / 1e3:.0f} kB block the first paint"
        paints = [(measured["fcp"], None)]  # (this page, the reference page loaded just before it), ms
        while not _paints_in_time(paints) and len(paints) < 4:
            reference = _fresh_first_paint(visit, REFERENCE_PAGE)
            paints.append((_fresh_first_paint(visit, path), reference))
        assert _paints_in_time(paints), (f"{path}: first paint (ms) {paints} as (this page, {REFERENCE_PAGE}): the best "
                                         f"over {FIRST_PAINT_MS} ms and over {PAINT_RATIO} times the reference's best")
    plotly = page.evaluate("() => [...document.scripts].filter(s => /plotly[^/]*\\.js/.test(s.src))"
                           ".map(s => ({defer: s.defer, async: s.async, head: s.parentElement.tagName}))")
    assert (len(plotly) == 1) == bool(figures), f"{path}: plotly.js {plotly} with {figures} figures"
    assert all(s["defer"] or s["async"] for s in plotly), f"{path}: plotly.js blocks the first paint"
    assert v.errors == [] and v.outside == []


def test_chapters_offer_their_executed_notebook():
    if not CHAPTERS:
        _missing(f"no built site at {SITE}")
    for path in CHAPTERS:
        html = (SITE / path).read_text()
        links = re.findall(r'href="([^"]*-with-outputs\.ipynb)"', html)
        assert links, f"{path} offers no executed notebook"
        target = (SITE / path).parent / links[0]
        import json

        nb = json.loads(target.read_text())
        outputs = [o for c in nb["cells"] if c["cell_type"] == "code" for o in c.get("outputs", [])]
        assert any("application/vnd.plotly.v1+json" in o.get("data", {}) for o in outputs), target
        texts = "".join("".join(o.get("text", "")) + "".join(o.get("data", {}).get("text/plain", "")) for o in outputs)
        assert not re.search(r"\b0%\|", texts), f"{target}: a progress bar saved at 0%"


def test_the_claims_page_has_one_row_per_claim_of_the_executed_chapters_with_working_links():
    """book/claims.html lists every ledger entry (pe.claim) of the executed chapters once, links each claim to an
    anchor of its chapter and each source to the bibliography, and counts them."""
    import html as html_lib
    import json
    from urllib.parse import unquote, urljoin

    import posenc as pe

    page = SITE / "book" / "claims.html"
    if not page.exists():
        _missing(f"no built page {page}")
    entries = {}
    for nb in sorted((SITE / "_executed" / "chapters").glob("*-with-outputs.ipynb")):
        for entry in pe.entries_in_notebook(json.loads(nb.read_text(encoding="utf8"))):
            assert entry.key not in entries, f"claim {entry.key} recorded twice"
            entries[entry.key] = (nb.name.removesuffix("-with-outputs.ipynb"), entry)
    html = page.read_text(encoding="utf8")
    rows = dict(re.findall(r'<tr[^>]*id="claim-([^"]+)"[^>]*>(.*?)</tr>', html, flags=re.S))
    assert len(re.findall(r'<tr[^>]*id="claim-', html)) == len(rows) == len(entries) >= 30
    assert set(rows) == set(entries)
    sources = {s for _, e in entries.values() for s in e.source}
    assert f"{len(entries)} claims from {len(sources)} sources" in html
    base = "http://site/book/claims.html"
    for key, (chapter, entry) in entries.items():
        row = html_lib.unescape(rows[key])
        assert entry.verdict in row and entry.measured in row, key
        links = re.findall(r'href="([^"]+)"', rows[key])
        assert len(links) == 1 + len(entry.source), f"{key}: {links}"
        for link in links:
            url = urljoin(base, html_lib.unescape(link))
            path, _, anchor = url.removeprefix("http://site/").partition("#")
            target = SITE / unquote(path)
            assert target.is_file() and anchor and f'id="{anchor}"' in target.read_text(encoding="utf8"), f"{key}: {link}"
        assert links[0].split("#")[0].endswith(f"chapters/{chapter}.html"), f"{key}: {links[0]}"
        assert all("bibliography.html#" in link for link in links[1:]), f"{key}: {links}"


@pytest.mark.parametrize("viewport", [PHONE, DESKTOP])
def test_the_claims_page_reads_on_a_phone_and_a_desktop(visit, viewport):
    v = visit("book/claims.html", viewport)
    info = v.page.evaluate("""() => { const t = [...document.querySelectorAll('.posenc-ledger')];
        return {boxes: t.length, rows: document.querySelectorAll('.posenc-ledger tbody tr').length,
                scroll: t.map(b => getComputedStyle(b).overflowX), page: document.documentElement.scrollWidth}; }""")
    assert info["boxes"] >= 5 and info["rows"] >= 30, info
    assert set(info["scroll"]) == {"auto"} and info["page"] <= viewport[0], info
    assert v.errors == []
