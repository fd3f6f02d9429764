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


def test_a_page_from_the_execution_cache_still_offers_its_outputs(tmp_path):
    """myst-nb writes the unexecuted notebook when a page's outputs come from jupyter-cache (a cached rebuild);
    the download "with outputs" then takes them from the cache, and is not offered when there are none."""
    import json
    import types

    import nbformat
    from jupyter_cache import get_cache
    from jupyter_cache.base import CacheBundleIn

    ext = _extension()
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# t"), nbformat.v4.new_code_cell("1 + 1")])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    executed = nbformat.from_dict(json.loads(nbformat.writes(nb)))
    executed.cells[1].outputs = [nbformat.v4.new_output("execute_result", {"text/plain": "2"}, execution_count=1)]
    executed.cells[1].execution_count = 1
    cache = get_cache(tmp_path / "cache")
    cache.cache_notebook_bundle(CacheBundleIn(executed, "page.ipynb"), check_validity=False)
    app = types.SimpleNamespace(env=types.SimpleNamespace(
        mystnb_config=types.SimpleNamespace(execution_cache_path=str(tmp_path / "cache"))))
    as_written = nbformat.writes(nb)  # what jupyter_execute/ holds after a cached rebuild
    merged = json.loads(ext._with_cached_outputs(app, as_written))
    assert "".join(merged["cells"][1]["outputs"][0]["data"]["text/plain"]) == "2"
    assert ext._with_cached_outputs(app, nbformat.writes(executed)) == nbformat.writes(executed)  # a fresh build
    other = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("2 + 2")], metadata=nb.metadata)
    assert ext._with_cached_outputs(app, nbformat.writes(other)) is None  # nothing cached: no empty download


def test_one_execution_cache_per_mode_seed_kernel_set_and_library(tmp_path):
    """jupyter-cache keys notebooks by their code only: the build's settings and the library choose the cache folder."""
    ext = _extension()
    lib = ext.library_digest()
    name = ext.execution_cache_name
    assert name(".jupyter_cache", {"POSENC_SIZE": "small"}) == f".jupyter_cache-small-lib{lib}"
    assert name(".jupyter_cache", {"POSENC_SIZE": "small", "POSENC_SEED": "0"}) == f".jupyter_cache-small-lib{lib}"
    assert name(".jupyter_cache", {}) == f".jupyter_cache-auto-lib{lib}"
    seeded = name(".jupyter_cache", {"POSENC_SIZE": "small", "POSENC_SEED": "1", "ATEN_CPU_CAPABILITY": "default"})
    assert seeded == f".jupyter_cache-small-lib{lib}-seed1-default"
    names = {name(".jupyter_cache", {"POSENC_SIZE": size, "POSENC_SEED": seed, "ATEN_CPU_CAPABILITY": kernels})
             for size in ("small", "full") for seed in ("", "1", "2") for kernels in ("", "default", "avx2")}
    assert len(names) == 2 * 3 * 3 and all("/" not in n for n in names)
    assert "/" not in name(".jupyter_cache", {"POSENC_SEED": "../x"})
    # an edit to any file of the library (a module, a shipped table) names another cache; undoing it, the same one
    (tmp_path / "measured").mkdir()
    (tmp_path / "a.py").write_text("x = 1\n"), (tmp_path / "measured" / "t.csv").write_text("n\n1\n")
    small = {"POSENC_SIZE": "small"}
    first = name(".jupyter_cache", small, library=tmp_path)
    (tmp_path / "measured" / "t.csv").write_text("n\n2\n")
    assert name(".jupyter_cache", small, library=tmp_path) != first
    (tmp_path / "measured" / "t.csv").write_text("n\n1\n")
    (tmp_path / "__pycache__").mkdir(), (tmp_path / "__pycache__" / "a.pyc").write_bytes(b"\0")
    assert name(".jupyter_cache", small, library=tmp_path) == first  # byte code is not the library


def test_a_build_removes_the_pages_of_sources_that_are_gone(tmp_path):
    """A renamed chapter leaves no HTML page, executed notebook or reader copy of its old name on the site."""
    import types

    ext = _extension()
    out = tmp_path / "html"
    kept = ["chapters/12_summary.html", "_executed/chapters/12_summary-with-outputs.ipynb",
            "_notebooks/chapters/12_summary.ipynb", "book/claims.html", "index.html", "search.html",
            "_static/chapters/11_summary.html"]
    gone = ["chapters/11_summary.html", "_executed/chapters/11_summary-with-outputs.ipynb",
            "_notebooks/chapters/11_summary.ipynb"]
    for name in kept + gone:
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text("x")
    app = types.SimpleNamespace(outdir=str(out), builder=types.SimpleNamespace(format="html"),
                                env=types.SimpleNamespace(found_docs={"chapters/12_summary", "book/claims", "book/intro"}))
    ext._drop_removed_pages(app, RuntimeError("a failed build"))       # a failed build removes nothing
    assert all((out / name).exists() for name in kept + gone)
    ext._drop_removed_pages(app, None)
    assert all((out / name).exists() for name in kept)
    assert not any((out / name).exists() for name in gone)
