import plotly.graph_objects as go
import plotly.io as pio
import pytest
import torch

import posenc as pe


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
    monkeypatch.setenv(pe.viz.STATIC_ENV, "1")
    assert set(renderer.to_mimebundle(fig.to_dict())) == {"text/html"}


def test_heatmap_and_curves_validate():
    with pytest.raises(ValueError, match="2-D"):
        pe.viz.heatmap(torch.zeros(2, 2, 2))
    with pytest.raises(ValueError, match="shape"):
        pe.viz.curves(torch.arange(3), {"a": torch.arange(4)})
