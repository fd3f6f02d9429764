"""The book's vendored assets: the plotly.js bundle matches the plotly package that draws the figures."""

import importlib.util
from pathlib import Path

import plotly

EXT = Path(__file__).resolve().parents[1] / "book" / "_ext"


def _extension():
    spec = importlib.util.spec_from_file_location("posenc_book_for_tests", EXT / "posenc_book.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_vendored_plotly_matches_the_python_package():
    ext = _extension()
    vendored = ext.plotly_js_version(ext.CARTESIAN_PLOTLY_JS)
    python = ext.plotly_js_version(ext.FULL_PLOTLY_JS)
    assert python == plotly.offline.get_plotlyjs_version()
    assert vendored.split(".")[:2] == python.split(".")[:2], (
        f"vendored plotly.js {vendored}, plotly package {python}: update book/_ext/vendor/ (see its README)")
    assert ext.PLOTLY_JS == ext.CARTESIAN_PLOTLY_JS
    readme = (EXT / "vendor" / "README.md").read_text()
    assert f"version **{vendored}**" in readme and (EXT / "vendor" / "plotly-cartesian.LICENSE").exists()


def test_vendored_plotly_has_every_trace_type_the_book_draws():
    """Scatter, heatmap and bar: the types the chapters and posenc.viz use."""
    import json

    chapters = Path(__file__).resolve().parents[1] / "chapters"
    code = "".join("".join(c["source"]) for p in chapters.glob("*.ipynb")
                   for c in json.loads(p.read_text())["cells"] if c["cell_type"] == "code")
    used = {name for name in ("Scatter", "Heatmap", "Bar", "Surface", "Scatter3d", "Scattergl", "Contour",
                              "Histogram", "Pie", "Box", "Violin", "Scatterpolar", "Sankey", "Table")
            if f"go.{name}(" in code}
    assert used <= {"Scatter", "Heatmap", "Bar", "Contour", "Histogram", "Pie", "Box", "Violin"}, used
    assert "make_subplots" not in code or "specs=" not in code  # no 3-D or polar subplots
