"""The notebooks as readers run them: JupyterLab 4 in Chromium on a phone's width, with a live kernel.

On the website the figures are fitted by the page's own script; in a notebook
front end (JupyterLab, Colab) ipywidgets and plotly's JSON draw them as the
library lays them out. Checked here: a live slider fits 390 px with its
readout, reads as the figure's title writes the value, redraws the figure with
the axes kept, the legend lies under the plot, nothing is fetched from outside
and the console stays clean. Skipped without JupyterLab or Chromium (failed
instead when ``POSENC_REQUIRE_SITE`` is set, as CI does).
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

import pytest

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
    labconfig = root / "config" / "labconfig"
    labconfig.mkdir(parents=True)      # no "get Jupyter news?" prompt, which would ask for an outside feed
    (labconfig / "page_config.json").write_text(json.dumps(
        {"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": True}}))
    env = {k: v for k, v in os.environ.items() if k not in ("POSENC_STATIC", "POSENC_PROGRESS")}
    env.update(JUPYTER_RUNTIME_DIR=str(root / "runtime"), JUPYTER_CONFIG_DIR=str(root / "config"),
               IPYTHONDIR=str(root / "ipython"), OMP_NUM_THREADS="1")
    port = _free_port()
    log = open(root / "lab.log", "w")
    server = subprocess.Popen(
        [str(LAB), "--no-browser", "--allow-root", f"--port={port}", "--ServerApp.ip=127.0.0.1",
         f"--IdentityProvider.token={TOKEN}", f"--ServerApp.root_dir={root}", "--expose-app-in-browser",
         "--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
         "--LabApp.extension_manager=readonly"],
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
        yield url
    finally:
        server.terminate()
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


@pytest.fixture(scope="module", params=[PHONE, DESKTOP], ids=["390x844", "1366x900"])
def phone_page(lab, request):
    playwright = pytest.importorskip("playwright.sync_api")
    if not Path(CHROMIUM).exists():
        _missing(f"Chromium not found at {CHROMIUM} (Debian: apt-get install chromium)")
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                    args=["--no-sandbox", "--disable-gpu", "--no-first-run",
                                          "--disable-background-networking", "--disable-component-update"])
        page = browser.new_context(viewport=request.param).new_page()
        errors, outside = [], []
        page.on("console", lambda m: m.type == "error" and errors.append(m.text))
        page.on("pageerror", lambda e: errors.append(str(e)))

        def route(r):
            if r.request.url.startswith(("data:", "blob:")) or urlparse(r.request.url).hostname == "127.0.0.1":
                return r.continue_()
            outside.append(r.request.url)
            return r.abort()

        page.route("**/*", route)
        page.goto(f"{lab}/lab/tree/live.ipynb?token={TOKEN}", wait_until="load")
        page.wait_for_function("() => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;"
                               " return w && w.sessionContext && w.sessionContext.session"
                               " && w.sessionContext.session.kernel; }", timeout=90_000)
        page.evaluate("() => { const s = window.jupyterapp.shell; s.collapseLeft(); s.collapseRight();"
                      " s.mode = 'single-document'; }")    # what a reader on a phone does first
        page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")
        page.wait_for_selector(".widget-slider", timeout=90_000)
        page.wait_for_selector(".js-plotly-plot .legend", timeout=90_000)
        page.wait_for_timeout(500)
        yield page, errors, outside, request.param["width"]
        browser.close()


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
