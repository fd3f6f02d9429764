"""The notebooks as readers run them: JupyterLab 4 in Chromium on a phone's width, with a live kernel.

On the website the figures are fitted by the page's own script; in a notebook
front end (JupyterLab, Colab) ipywidgets and plotly's JSON draw them as the
library lays them out. Checked here: a live slider fits 390 px with its
readout, reads as the figure's title writes the value, redraws the figure with
the axes kept, the legend lies under the plot, nothing is fetched from outside
and the console stays clean.

And a chapter's reader copy (``book/reader_copy.py``) as a reader runs it:
Run All in JupyterLab at 1366x900 shows no solution's answer, anywhere on
the page or in the saved file, while the reader's own check cells say "not
answered yet"; at 390x844 no figure's title lies under plotly's mode bar.

And a chapter with several live sliders (chapter 11's derivations, up to its
first training cell, as a reader copy): Run All, then every slider of every
figure moved, at 390x844 and 1366x900: each move redraws its own figure, the
sliders and figures fit the screen, nothing is fetched from outside and the
console stays clean. Screenshots go to ``$POSENC_SCREENSHOTS`` when it is set.

Skipped without JupyterLab or Chromium (failed instead when
``POSENC_REQUIRE_SITE`` is set, as CI does).
"""

import ast
import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

import pytest

ROOT = Path(__file__).resolve().parents[1]
READER_CHAPTER = ROOT / "chapters" / "03_rope.ipynb"      # fast: no training
SLIDER_CHAPTER = ROOT / "chapters" / "11_content_positions.ipynb"   # four live sliders before its training
SLIDER_PART_ENDS = "## Trained short, tested long"                # the first section that trains
SLIDER_PART = "11_derivations.ipynb"
SHOTS = os.environ.get("POSENC_SCREENSHOTS", "")
REQUIRED = os.environ.get("POSENC_REQUIRE_SITE", "") not in ("", "0")
CHROMIUM = os.environ.get("CHROMIUM", shutil.which("chromium") or "/usr/bin/chromium")
LAB = Path(sys.executable).with_name("jupyter-lab")
TOKEN = "posenc-test"
PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1366, "height": 900}
CELL = '''import torch
import posenc as pe

def make(base):
    x = torch.arange(1, 200)
    return pe.viz.curves(x, {f"pair {i}, base {base:g}": torch.cos(x / base ** (i / 4)) for i in range(5)},
                         title=f"base = {base:g}", xlabel="distance", ylabel="cos")

pe.viz.interactive(make, base=[100, 10000, 1000000])'''


def _missing(reason):
    if REQUIRED:
        pytest.fail(reason)
    pytest.skip(reason)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    nbformat = pytest.importorskip("nbformat")
    if not LAB.exists():
        _missing(f"JupyterLab not found at {LAB} (pip install 'jupyterlab>=4')")
    root = tmp_path_factory.mktemp("lab")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# Live sliders"),
                                         nbformat.v4.new_code_cell(CELL)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, root / "live.ipynb")
    spec = importlib.util.spec_from_file_location("posenc_reader_copy_for_lab", ROOT / "book" / "reader_copy.py")
    reader_copy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reader_copy)  # the chapter's copy, as the build writes it (without glued values)
    reader_copy.main([str(READER_CHAPTER), str(SLIDER_CHAPTER), "-o", str(root), "--glue-dir", str(root / "no-glue")])
    copy = json.loads((root / SLIDER_CHAPTER.name).read_text(encoding="utf8"))
    ends = [i for i, c in enumerate(copy["cells"]) if "".join(c["source"]).startswith(SLIDER_PART_ENDS)]
    assert ends, f"{SLIDER_CHAPTER.name} has no section {SLIDER_PART_ENDS!r}: choose where its slider part ends"
    copy["cells"] = copy["cells"][:ends[0]]
    (root / SLIDER_PART).write_text(json.dumps(copy, indent=1, ensure_ascii=False) + "\n", encoding="utf8")
    labconfig = root / "config" / "labconfig"
    labconfig.mkdir(parents=True)      # no "get Jupyter news?" prompt, which would ask for an outside feed
    (labconfig / "page_config.json").write_text(json.dumps(
        {"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": True}}))
    tracker = root / "settings" / "@jupyterlab" / "notebook-extension"
    tracker.mkdir(parents=True)   # every cell in the page, not only those near the view: all can be checked
    (tracker / "tracker.jupyterlab-settings").write_text(json.dumps({"windowingMode": "none"}))
    env = {k: v for k, v in os.environ.items() if k not in ("POSENC_STATIC", "POSENC_PROGRESS")}
    env.update(JUPYTER_RUNTIME_DIR=str(root / "runtime"), JUPYTER_CONFIG_DIR=str(root / "config"),
               IPYTHONDIR=str(root / "ipython"), OMP_NUM_THREADS="1", JUPYTERLAB_SETTINGS_DIR=str(root / "settings"),
               JUPYTERLAB_WORKSPACES_DIR=str(root / "workspaces"), POSENC_SIZE="small", POSENC_PROGRESS="0",
               POSENC_CACHE=str(root / "cache"))
    port = _free_port()
    log = open(root / "lab.log", "w")
    server = subprocess.Popen(
        [str(LAB), "--no-browser", "--allow-root", f"--port={port}", "--ServerApp.ip=127.0.0.1",
         f"--IdentityProvider.token={TOKEN}", f"--ServerApp.root_dir={root}", "--expose-app-in-browser",
         "--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
         "--LabApp.extension_manager=readonly",
         "--KernelManager.transport=ipc"],  # kernels on socket files: no TCP port to share with other kernels
        stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{url}/api/status?token={TOKEN}", timeout=2)
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    pytest.fail("JupyterLab did not start:\n" + (root / "lab.log").read_text()[-3000:])
                time.sleep(0.3)
        yield url, root
    finally:
        server.terminate()
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


@pytest.fixture(scope="module")
def browser():
    """Debian's Chromium, driven by Playwright (one for the module: its sync API runs once per thread)."""
    playwright = pytest.importorskip("playwright.sync_api")
    if not Path(CHROMIUM).exists():
        _missing(f"Chromium not found at {CHROMIUM} (Debian: apt-get install chromium)")
    with playwright.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                     args=["--no-sandbox", "--disable-gpu", "--no-first-run",
                                           "--disable-background-networking", "--disable-component-update"])
        try:
            yield chromium
        finally:
            chromium.close()


def _open_notebook(browser, url, name, viewport):
    """A page of JupyterLab with the notebook ``name`` open and its kernel started: (page, errors, outside)."""
    page = browser.new_context(viewport=viewport).new_page()
    page.set_default_timeout(60_000)
    errors, outside = [], []
    page.on("console", lambda m: m.type == "error" and errors.append(m.text))
    page.on("pageerror", lambda e: errors.append(str(e)))

    def route(r):  # nothing but the local server
        if r.request.url.startswith(("data:", "blob:")) or urlparse(r.request.url).hostname == "127.0.0.1":
            return r.continue_()
        outside.append(r.request.url)
        return r.abort()

    page.route("**/*", route)
    workspace = f"{Path(name).stem}-{viewport['width']}".replace("_", "-")  # its own: no other notebook restored
    page.goto(f"{url}/lab/workspaces/{workspace}/tree/{name}?token={TOKEN}&reset", wait_until="load")
    page.wait_for_function("() => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;"
                           " return w && w.sessionContext && w.sessionContext.session"
                           " && w.sessionContext.session.kernel; }", timeout=90_000)
    page.evaluate("() => { const s = window.jupyterapp.shell; s.collapseLeft(); s.collapseRight();"
                  " s.mode = 'single-document'; }")    # what a reader on a phone does first
    return page, errors, outside


@pytest.fixture(scope="module", params=[PHONE, DESKTOP], ids=["390x844", "1366x900"])
def phone_page(lab, browser, request):
    page, errors, outside = _open_notebook(browser, lab[0], "live.ipynb", request.param)
    try:
        page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")
        page.wait_for_selector(".widget-slider", timeout=90_000)
        page.wait_for_selector(".js-plotly-plot .legend", timeout=90_000)
        page.wait_for_timeout(500)
        yield page, errors, outside, request.param["width"]
    finally:
        page.context.close()


_BOXES = """() => {
  const box = e => e && e.getBoundingClientRect().toJSON(), plot = document.querySelector('.js-plotly-plot');
  return {readout: box(document.querySelector('.widget-readout')),
          text: document.querySelector('.widget-readout').textContent.trim(),
          slider: box(document.querySelector('.widget-slider')), plot: box(plot), area: box(plot.querySelector('.nsewdrag')), legend: box(plot.querySelector('g.legend')),
          title: plot.querySelector('.gtitle').textContent, yrange: plot.layout.yaxis.range};
}"""


def test_a_live_slider_fits_the_screen_and_reads_as_the_title(phone_page):
    page, errors, outside, width = phone_page
    state = page.evaluate(_BOXES)
    assert state["text"] == "100" and state["title"] == "base = 100"
    assert 0 <= state["readout"]["left"] and state["readout"]["right"] <= width          # the readout is not cut off
    slider = state["readout"]["right"] - state["slider"]["left"]
    assert slider <= 425                                                                  # fills the width up to 420 px
    assert state["legend"]["top"] >= state["area"]["bottom"]                               # the legend under the plot
    assert state["area"]["width"] >= 0.6 * state["plot"]["width"]                          # the plot keeps the width
    assert state["plot"]["right"] <= width
    assert not errors and not outside


def test_moving_the_live_slider_redraws_with_the_axes_kept(phone_page):
    page, errors, outside, _ = phone_page
    before = page.evaluate(_BOXES)
    page.locator(".widget-slider .noUi-handle, .widget-slider .ui-slider-handle").first.focus()
    page.keyboard.press("End")                                                               # the last value
    page.wait_for_function("() => document.querySelector('.js-plotly-plot .gtitle').textContent === 'base = 1e+06'",
                           timeout=30_000)
    after = page.evaluate(_BOXES)
    assert after["text"] == "1e+06"                                                          # readout = title
    assert after["yrange"] == before["yrange"]                                               # as on the website
    assert not errors and not outside


def _solution_markers(path):
    """Text only a solution prints: the check's "✓ n.k: correct" and the fixed text of each print() of a solution."""
    cells = json.loads(path.read_text(encoding="utf8"))["cells"]
    markers = {"✓", ": correct"}
    for cell in cells:
        if cell["cell_type"] != "code" or "hide-cell" not in cell["metadata"].get("tags", []):
            continue
        for node in ast.walk(ast.parse("".join(cell["source"]))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "print" and node.args:
                first = node.args[0]
                for part in first.values if isinstance(first, ast.JoinedStr) else [first]:
                    if isinstance(part, ast.Constant) and isinstance(part.value, str):
                        text = part.value.strip(" ,:|")
                        if len(text) >= 8:
                            markers.add(text)
    rest = "".join("".join(c["source"]) for c in cells if "hide-cell" not in c["metadata"].get("tags", []))
    return {m for m in markers if m not in rest}  # not the text of an exercise, say


_RUN_STATE = """() => {
  const nb = window.jupyterapp.shell.currentWidget, session = nb.sessionContext.session;
  if (!session || !session.kernel) return {idle: false};
  const kernel = session.kernel;
  const code = nb.content.widgets.filter(c => c.model.type === 'code');
  const outputs = c => Array.from({length: c.model.outputs.length}, (_, i) => c.model.outputs.get(i).toJSON());
  const failed = code.some(c => outputs(c).some(o => o.output_type === 'error'));
  const text = o => [].concat(o.text || (o.data && o.data['text/plain']) || []).join('');
  return {idle: kernel.status === 'idle', done: code.every(c => c.model.executionCount !== null), failed,
          cells: code.length, open: document.querySelectorAll('.jp-RenderedMarkdown details[open]').length,
          folds: document.querySelectorAll('.jp-RenderedMarkdown details').length,
          outputs: code.map(c => outputs(c).map(text).join('')).join('\\n'),
          shown: Array.from(document.querySelectorAll('.jp-OutputArea-output')).map(e => e.innerText).join('\\n'),
          text: document.body.innerText};
}"""

def _run_all(page, settle_ms=0):
    """Run All in the open notebook; wait until every code cell has run (or one failed); the state of :data:`_RUN_STATE`."""
    page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")
    page.wait_for_function(f"() => {{ const s = ({_RUN_STATE})(); return s.idle && (s.done || s.failed); }}",
                           timeout=420_000, polling=1000)
    page.wait_for_timeout(settle_ms)
    return page.evaluate(_RUN_STATE)


_BOXES_OF = """p => { const box = e => e.getBoundingClientRect().toJSON();
  return {title: box(p.querySelector('.gtitle')), modebar: box(p.querySelector('.modebar')), plot: box(p),
          text: p.querySelector('.gtitle').textContent}; }"""


def _overlap(a, b):
    return a["left"] < b["right"] and b["left"] < a["right"] and a["top"] < b["bottom"] and b["top"] < a["bottom"]


def _shot(page, name):
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SHOTS) / name), full_page=False)


def test_run_all_on_a_reader_copy_shows_no_solution_and_titles_clear_the_mode_bar(lab, browser):
    """A reader's Run All: every cell runs, no answer is printed or saved, the checks say "not answered yet"."""
    url, root = lab
    name = READER_CHAPTER.name
    markers = _solution_markers(READER_CHAPTER)
    sources = ["".join(c["source"]) for c in json.loads(READER_CHAPTER.read_text(encoding="utf8"))["cells"]]
    exercises = sorted({m for s in sources if s.startswith("answer = ...")
                        for m in re.findall(r'pe\.exercises\.check\("(\d+\.\d+)"', s)})
    assert len(markers) > 2 and exercises
    page, errors, outside = _open_notebook(browser, url, name, DESKTOP)
    try:
        state = _run_all(page, settle_ms=1000)
        assert not state["failed"] and state["done"], state["outputs"][-3000:]
        assert state["folds"] >= len(exercises) and state["open"] == 0            # every solution folded
        for marker in markers:
            assert marker not in state["text"], f"a solution's answer shows: {marker!r}"
        for exercise in exercises:                                                # the reader's own checks
            assert f"{exercise}: not answered yet" in state["outputs"]
            assert f"{exercise}: not answered yet" in state["shown"]
        page.locator(".jp-OutputArea-output", has_text=f"{exercises[-1]}: not answered yet").scroll_into_view_if_needed()
        _shot(page, "reader-copy-run-all-1366.png")

        page.evaluate("window.jupyterapp.commands.execute('docmanager:save')")  # what autosave writes
        page.wait_for_function("() => !window.jupyterapp.shell.currentWidget.context.model.dirty", timeout=30_000)
        saved = json.loads((root / name).read_text(encoding="utf8"))
        outputs = json.dumps([c.get("outputs", []) for c in saved["cells"]], ensure_ascii=False)
        assert all(c["execution_count"] for c in saved["cells"] if c["cell_type"] == "code")
        for marker in markers:
            assert marker not in outputs, f"the saved file holds a solution's answer: {marker!r}"
        assert all(f"{e}: not answered yet" in outputs for e in exercises)

        # the reader opens a solution on purpose: its text and code, which runs only if copied into a cell
        fold = page.locator(".jp-RenderedMarkdown details").filter(has_text="effective base").first
        fold.locator("summary").click()
        assert fold.evaluate("d => d.open") and fold.locator("pre code").is_visible()
        assert "copy it into a cell" in fold.inner_text()
        fold.locator("pre").scroll_into_view_if_needed()
        _shot(page, "reader-copy-solution-open-1366.png")
        fold.locator("summary").click()

        # a citation leads to its entry in the reference list at the end
        link = page.locator('.jp-RenderedMarkdown a[href="#ref-su2021rope"]').first
        link.scroll_into_view_if_needed()
        link.click()
        page.wait_for_timeout(1000)
        entry = page.locator('[data-jupyter-id="ref-su2021rope"], #ref-su2021rope')  # JupyterLab renames ids
        assert entry.count() == 1
        top = entry.evaluate("e => e.getBoundingClientRect().top")
        assert 0 <= top <= DESKTOP["height"], top                                  # scrolled to it
        _shot(page, "reader-copy-citation-followed-1366.png")

        # a phone: the figures' titles wrap and stay clear of plotly's mode bar
        page.set_viewport_size(PHONE)
        page.wait_for_timeout(1500)
        plots = page.locator(".js-plotly-plot")
        checked = 0
        for i in range(plots.count()):
            plot = plots.nth(i)
            if not plot.locator(".gtitle").count():
                continue
            plot.scroll_into_view_if_needed()
            plot.locator(".nsewdrag").first.hover(force=True)                   # shows the mode bar
            page.wait_for_timeout(300)
            box = plot.evaluate(_BOXES_OF)
            assert box["modebar"]["width"] > 0, box
            assert not _overlap(box["title"], box["modebar"]), box
            assert box["plot"]["left"] - 1 <= box["title"]["left"] and box["title"]["right"] <= box["plot"]["right"] + 1
            assert box["plot"]["right"] <= PHONE["width"], box
            if checked == 0:
                _shot(page, "reader-copy-figure-390.png")
            checked += 1
        assert checked >= 2
        assert not outside, outside
        assert not [e for e in errors if "favicon" not in e], errors
    finally:
        page.context.close()


_SLIDERS = """box => { const plot = box.querySelector('.js-plotly-plot'), rect = e => e.getBoundingClientRect().toJSON();
  const handles = Array.from(box.querySelectorAll('.widget-slider .noUi-handle'));
  return {data: plot ? JSON.stringify(plot.data.map(t => [t.x, t.y, t.z, t.text])) : null,
          at: handles.map(h => [h.getAttribute('aria-valuenow'), h.getAttribute('aria-valuemax')]),
          readouts: Array.from(box.querySelectorAll('.widget-readout')).map(r => ({text: r.textContent.trim(), ...rect(r)})),
          plot: plot ? rect(plot) : null}; }"""


@pytest.mark.parametrize("viewport", [PHONE, DESKTOP], ids=["390x844", "1366x900"])
def test_every_live_slider_of_a_chapter_redraws_its_own_figure(lab, browser, viewport):
    """Run All on chapter 11's derivations; then each slider of each figure, moved to its other end, redraws that figure."""
    url, root = lab
    code = ["".join(c["source"]) for c in json.loads((root / SLIDER_PART).read_text(encoding="utf8"))["cells"]
            if c["cell_type"] == "code"]
    expected = sum(s.count("pe.viz.interactive(") for s in code)
    assert expected >= 4                                                         # FoX, stick-breaking, CoPE, SSMax
    width = viewport["width"]
    name = f"{Path(SLIDER_PART).stem}_{width}.ipynb"                  # a kernel and outputs of its own
    shutil.copy(root / SLIDER_PART, root / name)
    page, errors, outside = _open_notebook(browser, url, name, viewport)
    try:
        state = _run_all(page)
        assert not state["failed"] and state["done"], state["outputs"][-3000:]
        boxes = page.locator(".widget-vbox:has(.widget-slider)")
        page.wait_for_function(f"() => document.querySelectorAll('.widget-vbox .js-plotly-plot').length >= {expected}",
                               timeout=60_000)
        assert boxes.count() == expected
        moved = 0
        for i in range(expected):
            box = boxes.nth(i)
            box.scroll_into_view_if_needed()
            handle = box.element_handle()
            for j in range(box.locator(".widget-slider").count()):
                before = handle.evaluate(_SLIDERS)
                assert before["data"] and before["plot"]["right"] <= width + 1, before["plot"]
                assert all(0 <= r["left"] and r["right"] <= width for r in before["readouts"]), before["readouts"]
                now, last = before["at"][j]
                box.locator(".widget-slider .noUi-handle").nth(j).focus()
                page.keyboard.press("Home" if now == last else "End")                 # to the other end
                page.wait_for_function(f"([box, before]) => {{ const s = ({_SLIDERS})(box);"
                                       " return s.data && s.data !== before.data; }",
                                       arg=[handle, before], timeout=30_000)
                after = handle.evaluate(_SLIDERS)
                assert after["at"][j] != before["at"][j]                               # the slider moved
                assert after["readouts"][j]["text"] != before["readouts"][j]["text"]   # and reads its new value
                assert after["plot"]["right"] <= width + 1, after["plot"]
                moved += 1
            if i == 0:
                _shot(page, f"chapter-sliders-moved-{width}.png")
        assert moved >= expected
        assert not outside, outside
        assert not [e for e in errors if "favicon" not in e], errors
    finally:
        page.context.close()
