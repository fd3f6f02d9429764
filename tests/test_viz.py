import math

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio
import pytest
import torch

import posenc as pe
import posenc._render


def _fig(value):
    return pe.viz.curves(torch.arange(5), {"a": torch.arange(5) * value, "b": torch.ones(5)},
                         title=f"value {value}")


def test_slider_figure_structure():
    fig = pe.viz.slider_figure(_fig, [1, 2, 3], name="slope", active=1)
    assert len(fig.data) == 6
    slider = fig.layout.sliders[0]
    assert slider.active == 1 and len(slider.steps) == 3
    assert [t.visible for t in fig.data] == [False, False, True, True, False, False]
    for index, step in enumerate(slider.steps):
        visible = step.args[0]["visible"]
        assert visible == [i // 2 == index for i in range(6)]
        assert step.args[1]["title.text"] == f"value {index + 1}"  # 'title.text', not 'title'
    assert slider.currentvalue.prefix == "slope = "
    assert fig.layout.title.text == "value 2"


def test_slider_figure_errors():
    with pytest.raises(ValueError, match="at least one"):
        pe.viz.slider_figure(_fig, [], name="x")
    with pytest.raises(ValueError, match="active"):
        pe.viz.slider_figure(_fig, [1], name="x", active=3)


def test_interactive_static_falls_back_to_first_parameter(monkeypatch):
    monkeypatch.setenv(pe.viz.STATIC_ENV, "1")
    calls = []

    def make(slope, heads):
        calls.append((slope, heads))
        return _fig(slope)

    fig = pe.viz.interactive(make, slope=[1, 2], heads=[4, 8], initial={"heads": 8})
    assert isinstance(fig, go.Figure) and len(fig.layout.sliders[0].steps) == 2
    assert calls == [(1, 8), (2, 8)]


def test_interactive_live_builds_widgets(monkeypatch):
    monkeypatch.delenv(pe.viz.STATIC_ENV, raising=False)
    widgets = pytest.importorskip("ipywidgets")
    box = pe.viz.interactive(lambda slope, heads: _fig(slope), slope=[1, 2], heads=[4, 8])
    assert isinstance(box, widgets.VBox)
    sliders = box.children[:2]
    assert [s.description for s in sliders] == ["slope", "heads"]
    sliders[0].value = 2  # moving a slider redraws without error


def test_interactive_errors():
    with pytest.raises(ValueError, match="at least one parameter"):
        pe.viz.interactive(_fig)
    with pytest.raises(ValueError, match="not one of"):
        pe.viz.interactive(_fig, value=[1, 2], initial={"value": 5})


def test_book_renderer_bundle(monkeypatch):
    fig = pe.viz.heatmap(torch.eye(3))
    renderer = pio.renderers["posenc"]
    monkeypatch.delenv(pe.viz.STATIC_ENV, raising=False)
    bundle = renderer.to_mimebundle(fig.to_dict())
    assert set(bundle) == {"application/vnd.plotly.v1+json", "text/html"}
    html = bundle["text/html"]
    assert "Plotly.newPlot" in html and "<script src" not in html  # plotly.js comes from the page
    assert 'class="plotly-graph-div"' in html and "DOMContentLoaded" in html  # drawn once deferred plotly.js ran
    assert '"histogram2dcontour"' not in html  # template styles only for the trace types it has
    monkeypatch.setenv(pe.viz.STATIC_ENV, "1")
    assert set(renderer.to_mimebundle(fig.to_dict())) == {"text/html"}


def test_figure_html_fits_narrow_screens_and_escapes_the_data():
    fig = pe.viz.curves(torch.arange(3), {"</script><b>": torch.ones(3), "b": torch.zeros(3)}, title="t")
    html = pio.renderers["posenc"].to_mimebundle(fig.to_dict())["text/html"]
    assert html.count("</script>") == 1  # the trace name cannot close the script
    for narrow in ('orientation: "h"', "displayModeBar", "len: 1", "wrap("):
        assert narrow in html


def test_log_axes_have_readable_ticks():
    fig = pe.viz.curves([1, 10, 100], {"a": [0.01, 0.1, 1]}, log_x=True, log_y=True)
    for axis in (fig.layout.xaxis, fig.layout.yaxis):  # two decades: 0.01, 0.02, 0.05, 0.1 ... not "2", "5"
        assert (axis.exponentformat, axis.minorloglabels, axis.dtick) == ("none", "complete", "D2")
    wide = pe.viz.curves([1, 2], {"a": [1e-6, 1]}, log_y=True).layout.yaxis  # six decades: 10^-6 ... 1
    assert (wide.exponentformat, wide.minorloglabels, wide.dtick) == ("power", "none", None)
    own = go.Figure(go.Scatter(x=[1, 2], y=[1, 2])).update_yaxes(type="log", exponentformat="e")
    assert pe.viz.readable_log_axes(own).layout.yaxis.exponentformat == "e"  # a figure's own choice stays
    assert pe.viz.readable_log_axes(own).layout.xaxis.exponentformat is None  # linear axes untouched


def test_slider_steps_carry_every_label_they_change():
    def fig(unit):
        f = pe.viz.curves([1, 2, 3], {"a": [1, 2, 3] if unit == "ratio" else [0, 50, 100]},
                          title=f"in {unit}", ylabel=f"{unit} axis", log_y=unit == "ratio")
        return f.add_hline(y=1) if unit == "ratio" else f
    slider = pe.viz.slider_figure(fig, ["ratio", "MiB"], name="unit").layout.sliders[0]
    ratio, mib = (step.args[1] for step in slider.steps)
    assert all(step.method == "update" for step in slider.steps)
    assert (ratio["yaxis.title.text"], mib["yaxis.title.text"]) == ("ratio axis", "MiB axis")
    assert (ratio["yaxis.type"], mib["yaxis.type"]) == ("log", None)  # None: back to a linear axis
    assert len(ratio["shapes"]) == 1 and mib["shapes"] == []
    assert ratio["yaxis.exponentformat"] == "none" and mib["yaxis.exponentformat"] is None
    assert mib["yaxis.range"] == [-5, 105] and ratio["yaxis.range"] == pytest.approx([-0.0239, 0.5010], abs=1e-3)


def test_slider_fixes_axis_ranges_over_all_steps():
    fig = pe.viz.slider_figure(_fig, [1, 2, 3], name="slope", active=0)
    ranges = [step.args[1]["yaxis.range"] for step in fig.layout.sliders[0].steps]
    assert ranges == [pytest.approx([-0.6, 12.6])] * 3  # 0..12 over all the steps, padded 5%
    assert fig.layout.yaxis.range == pytest.approx((-0.6, 12.6))
    assert all(step.args[1]["yaxis.autorange"] is False for step in fig.layout.sliders[0].steps)
    assert fig.layout.sliders[0].steps[0].args[1]["xaxis.range"] == [0, 4]  # lines only: no padding in x
    free = pe.viz.slider_figure(_fig, [1, 2, 3], name="slope", fixed_ranges=False)
    assert "yaxis.range" not in free.layout.sliders[0].steps[0].args[1] and free.layout.yaxis.range is None
    own = pe.viz.slider_figure(lambda v: _fig(v).update_yaxes(range=[0, v]), [1, 2], name="v")
    assert [s.args[1]["yaxis.range"] for s in own.layout.sliders[0].steps] == [[0, 1], [0, 2]]  # a step's own range


def test_slider_leaves_heatmap_axes_alone():
    fig = pe.viz.slider_figure(lambda n: pe.viz.heatmap(torch.eye(n)), [2, 3], name="n")
    assert all("yaxis.range" not in step.args[1] for step in fig.layout.sliders[0].steps)
    assert fig.layout.yaxis.autorange == "reversed"


def test_curves_styles_tell_curves_apart_without_colour():
    fig = pe.viz.curves([1, 2], {"a": [1, 2], "b": [2, 3]}, mode="lines+markers",
                        styles={"a": {"color": "#000000", "dash": "dash", "symbol": "square"}})
    a, b = fig.data
    assert (a.line.color, a.marker.color, a.line.dash, a.marker.symbol) == ("#000000", "#000000", "dash", "square")
    assert b.line.dash == "solid" and b.marker.symbol is None
    assert len(set(pe.viz.SYMBOLS)) == len(pe.viz.SYMBOLS) == len(pe.viz.PALETTE)


def test_heatmap_and_curves_validate():
    with pytest.raises(ValueError, match="2-D"):
        pe.viz.heatmap(torch.zeros(2, 2, 2))
    with pytest.raises(ValueError, match="shape"):
        pe.viz.curves(torch.arange(3), {"a": torch.arange(4)})


def test_a_few_log_spaced_lengths_get_a_tick_each():
    """Lengths a factor >= 1.5 apart are labelled where the points are; dense or close x values keep plotly's ticks."""
    viz = pe.viz
    fig = viz.curves([256, 512, 1024, 2048, 4096], {"a": [1, 2, 3, 4, 5]}, log_x=True)
    assert list(fig.layout.xaxis.tickvals) == [256, 512, 1024, 2048, 4096]
    assert list(fig.layout.xaxis.ticktext) == ["256", "512", "1024", "2048", "4096"]
    assert viz.curves([1, 1.1, 1.2, 2], {"a": [1, 2, 3, 4]}, log_x=True).layout.xaxis.tickvals is None
    assert viz.curves(list(range(1, 50)), {"a": list(range(1, 50))}, log_x=True).layout.xaxis.tickvals is None
    assert viz.curves([256, 512], {"a": [1, 2]}).layout.xaxis.tickvals is None          # linear axis: untouched


def test_live_sliders_read_as_the_titles_fit_a_phone_and_keep_the_axes(monkeypatch):
    """Live sliders: readouts as the titles write the values, a width that fits 390 px, axes fixed over the first
    parameter's values as on the website, and each of those figures computed once."""
    import IPython.display

    monkeypatch.delenv(pe.viz.STATIC_ENV, raising=False)
    widgets = pytest.importorskip("ipywidgets")
    shown, calls = [], []
    monkeypatch.setattr(IPython.display, "display", shown.append)

    def make(base, heads):
        calls.append((base, heads))
        return pe.viz.curves(torch.arange(4), {"a": torch.arange(4) * math.log10(base) * heads, "b": torch.ones(4)},
                             title=f"base = {base:g}")

    box = pe.viz.interactive(make, base=[100, 10000.0, 1_000_000], heads=[1, 2])
    assert isinstance(box, widgets.VBox)
    base, heads = box.children[:2]
    assert [label for label, _ in base.options] == ["100", "10000", "1e+06"] == [f"{v:g}" for v in (100, 1e4, 1e6)]
    assert base.index == 0 and base.value == 100
    assert base.layout.width == "100%" and base.layout.max_width == "420px"    # shrinks with a 390 px screen
    assert calls == [(100, 1), (10000.0, 1), (1_000_000, 1)]                     # the first slider's figures, once
    base.value = 1_000_000
    assert len(calls) == 3 and shown[-1].layout.title.text == "base = 1e+06"     # moving it recomputes nothing
    assert shown[0].layout.yaxis.range == shown[-1].layout.yaxis.range           # and keeps the axes
    heads.value = 2
    assert calls[3:] == [(100, 2), (10000.0, 2), (1_000_000, 2)] and shown[-1].layout.title.text == "base = 1e+06"
    monkeypatch.setenv(pe.viz.STATIC_ENV, "1")
    site = pe.viz.interactive(make, base=[100, 10000.0, 1_000_000], heads=[1, 2], initial={"heads": 2})
    assert [step.args[1]["yaxis.range"] for step in site.layout.sliders[0].steps] == [list(shown[-1].layout.yaxis.range)] * 3
    assert [step.label for step in site.layout.sliders[0].steps] == ["100", "10000", "1e+06"]   # the website's labels


def test_live_figures_put_the_legend_under_the_plot():
    fig = pe.viz.curves(torch.arange(5), {f"a long curve name {i}": torch.arange(5) * i for i in range(6)},
                        title="t", height=400)
    assert fig.layout.legend.orientation != "h"
    out = pe.viz.live_layout(go.Figure(fig), width=360)
    legend = out.layout.legend
    assert (legend.orientation, legend.yref, legend.y, legend.yanchor) == ("h", "container", 0, "bottom")
    rows = posenc._render._legend_rows([t.name for t in fig.data], 360 - 16)
    top = out.layout.margin.t - 50                                                   # room for the title, below
    assert rows >= 3 and out.layout.height == 400 + top + rows * 20 + 8 and out.layout.margin.b >= 50 + rows * 20 + 8
    assert out.layout.margin.r <= 20
    assert pe.viz.live_layout(out) is out and out.layout.height == 400 + top + rows * 20 + 8   # once only
    single = go.Figure(go.Scatter(y=[1, 2, 3], name="only"))
    assert pe.viz.live_layout(single).layout.legend.orientation is None   # plotly shows no legend: nothing to move
    bundle = pio.renderers["posenc"].to_mimebundle(fig.to_dict())
    json_layout = bundle.get("application/vnd.plotly.v1+json", {}).get("layout", {})
    if json_layout:                                                                   # a notebook front end's copy
        assert json_layout["legend"]["orientation"] == "h"


def test_bfloat16_and_half_tensors_are_drawn_as_float32():
    """torch's .numpy() has no bfloat16: the figures convert (a TypeError inside torch before)."""
    z = torch.randn(4, 5).to(torch.bfloat16)
    heat = pe.viz.heatmap(z)
    assert heat.data[0].z.dtype == np.float32 and np.allclose(heat.data[0].z, z.float().numpy())
    x = torch.arange(6).to(torch.bfloat16)
    fig = pe.viz.curves(x, {"bf16": x * 2, "half": (x / 3).half(), "float": x.float()},
                        ranges={"bf16": (x * 2 - 1, x * 2 + 1)})
    assert [trace.y.dtype for trace in fig.data] == [np.float32] * 3
    assert list(fig.data[0].y) == [0, 2, 4, 6, 8, 10] and fig.data[0].x.dtype == np.float32
    listed = pe.viz.curves([1, 2], {"a": [torch.tensor(0.5, dtype=torch.bfloat16), torch.tensor(1.5)]})
    assert list(listed.data[0].y) == [0.5, 1.5]                                     # a list of 0-d tensors
    pio.renderers["posenc"].to_mimebundle(fig.to_dict())                              # and it renders


def test_live_titles_wrap_to_a_phone_and_keep_clear_of_the_mode_bar():
    """A notebook draws plotly's layout as it is: the title wraps to a phone's figure and sits below the mode bar."""
    long = "Attention weights of one query when all keys look alike, for every head"
    fig = pe.viz.curves(torch.arange(3), {"a": torch.ones(3)}, title=long, height=400)
    out = pe.viz.live_layout(go.Figure(fig), width=360)
    title = out.layout.title
    lines = title.text.split("<br>")
    assert " ".join(lines) == long and len(lines) == 3
    assert all(len(line) * 0.56 * 15 <= posenc._render.TITLE_ROOM for line in lines)     # ~8.4 px a character
    assert max(map(len, lines)) - min(map(len, lines)) <= 8                          # balanced, no lone last word
    assert (title.yref, title.yanchor) == ("container", "middle")
    middle = (1 - title.y) * out.layout.height                                       # px from the top
    assert posenc._render.MODEBAR_BAND + 10 <= middle <= out.layout.margin.t - 20
    assert out.layout.margin.t >= posenc._render.MODEBAR_BAND + 3 * 19                        # three lines fit above the plot
    assert out.layout.height - out.layout.margin.t - out.layout.margin.b == 400 - 50 - 50  # the plot keeps its height
    again = pe.viz.live_layout(out, width=360)
    assert again.layout.title.text == title.text and again.layout.height == out.layout.height  # once only
    short = pe.viz.live_layout(pe.viz.curves([1, 2], {"a": [1, 2]}, title="Wavelengths after context extension, s = 8"))
    assert short.layout.title.text == "Wavelengths after context<br>extension, s = 8"  # not "... s =<br>8"
    math_title = pe.viz.live_layout(pe.viz.curves([1, 2], {"a": [1, 2]}, title="$" + "x" * 80 + "$"))
    assert "<br>" not in math_title.layout.title.text                                # LaTeX is left whole
    bare = pe.viz.live_layout(pe.viz.curves([1, 2], {"a": [1, 2]}))
    assert bare.layout.margin.t is None and bare.layout.title.yref is None          # no title: nothing to move


def test_live_slider_steps_wrap_their_titles_too():
    fig = pe.viz.slider_figure(lambda v: _fig(v).update_layout(title=f"a rather long title for the value {v} " * 2),
                               [1, 2], name="v")
    out = pe.viz.live_layout(fig, width=360)
    for step in out.layout.sliders[0].steps:
        assert "<br>" in step.args[1]["title.text"]
    assert out.layout.title.text == out.layout.sliders[0].steps[0].args[1]["title.text"]


def test_the_notebook_copy_of_a_figure_carries_the_config(monkeypatch):
    monkeypatch.delenv(pe.viz.STATIC_ENV, raising=False)
    fig = pe.viz.curves([1, 2], {"a": [1, 2]}, title="t")
    spec = pio.renderers["posenc"].to_mimebundle(fig.to_dict())["application/vnd.plotly.v1+json"]
    assert spec["config"]["displaylogo"] is False and "lasso2d" in spec["config"]["modeBarButtonsToRemove"]
    assert spec["layout"]["title"]["yref"] == "container"                             # laid out for a notebook
    assert "yref" not in (fig.layout.title.to_plotly_json())                          # the figure itself unchanged
