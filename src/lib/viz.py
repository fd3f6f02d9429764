"""Figures in one style, sliders that work with and without a kernel.

* :func:`heatmap` and :func:`curves` draw the book's two kinds of figure.
* :func:`slider_figure` precomputes a figure for every value of one parameter
  and stacks them behind a plotly slider: it works on the static website, in
  JupyterLab, VS Code and Colab alike, with no kernel.
* :func:`interactive` gives live ipywidgets sliders in a running kernel (any
  number of parameters, figures recomputed on every move) and falls back to
  :func:`slider_figure` where no kernel will answer (the website build sets
  ``POSENC_STATIC=1``).

Importing this module registers a plotly renderer, ``"posenc"``, that emits
each figure both as plotly's own JSON (for JupyterLab and VS Code) and as a
small HTML ``<div>`` that uses the page's ``Plotly`` object (for the website,
which loads plotly.js once per page from a local copy). On Colab, plotly's
``colab`` renderer is kept.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Union

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio
from plotly.io._base_renderers import MimetypeRenderer

__all__ = [
    "PALETTE",
    "STATIC_ENV",
    "heatmap",
    "curves",
    "slider_figure",
    "interactive",
    "is_static",
    "use_book_renderer",
]

STATIC_ENV = "POSENC_STATIC"

#: Okabe-Ito colours (distinguishable with colour-vision deficiencies).
PALETTE = [
    "#0072B2", "#E69F00", "#009E73", "#D55E00",
    "#CC79A7", "#56B4E9", "#F0E442", "#000000",
]

_FONT = "system-ui, -apple-system, 'Segoe UI', Roboto, 'Helvetica Neue', Arial, sans-serif"
_CONFIG = {"displaylogo": False, "responsive": True}

pio.templates["posenc"] = go.layout.Template(
    layout=dict(
        font=dict(family=_FONT, size=13, color="#222"),
        colorway=PALETTE,
        margin=dict(l=60, r=20, t=50, b=50),
        title=dict(x=0.02, xanchor="left", font=dict(size=15)),
        legend=dict(bgcolor="rgba(255,255,255,0.7)"),
        hoverlabel=dict(font=dict(family=_FONT)),
    )
)
_TEMPLATE = "plotly_white+posenc"

ArrayLike = Union[np.ndarray, Sequence[float], Any]


def _to_numpy(a: ArrayLike) -> np.ndarray:
    if hasattr(a, "detach"):  # torch tensor
        a = a.detach().cpu().numpy()
    return np.asarray(a)


def heatmap(
    z: ArrayLike,
    *,
    x: Optional[ArrayLike] = None,
    y: Optional[ArrayLike] = None,
    title: Optional[str] = None,
    xlabel: Optional[str] = None,
    ylabel: Optional[str] = None,
    colorscale: str = "RdBu_r",
    zmid: Optional[float] = None,
    zmin: Optional[float] = None,
    zmax: Optional[float] = None,
    colorbar_title: Optional[str] = None,
    reversed_y: bool = True,
    height: int = 420,
) -> go.Figure:
    """A 2-D array as a heatmap, row 0 at the top (like a matrix) by default."""
    z = _to_numpy(z)
    if z.ndim != 2:
        raise ValueError(f"heatmap needs a 2-D array, got shape {z.shape}")
    trace = go.Heatmap(
        z=z,
        x=None if x is None else _to_numpy(x),
        y=None if y is None else _to_numpy(y),
        colorscale=colorscale,
        zmid=zmid,
        zmin=zmin,
        zmax=zmax,
        colorbar=dict(title=dict(text=colorbar_title or "")),
    )
    fig = go.Figure(trace)
    fig.update_layout(template=_TEMPLATE, title=title, height=height,
                      xaxis_title=xlabel, yaxis_title=ylabel)
    if reversed_y:
        fig.update_yaxes(autorange="reversed")
    return fig


def curves(
    x: ArrayLike,
    ys: Union[Mapping[str, ArrayLike], ArrayLike],
    *,
    title: Optional[str] = None,
    xlabel: Optional[str] = None,
    ylabel: Optional[str] = None,
    mode: str = "lines",
    log_x: bool = False,
    log_y: bool = False,
    dashes: Optional[Mapping[str, str]] = None,
    height: int = 400,
) -> go.Figure:
    """One or more curves over the same ``x``.

    Args:
        ys: a mapping ``name -> values`` (one legend entry each) or one array.
        dashes: optional ``name -> dash style`` (``"dot"``, ``"dash"``, ...).
    """
    x = _to_numpy(x)
    if not isinstance(ys, Mapping):
        ys = {"": ys}
    fig = go.Figure()
    for name, y in ys.items():
        y = _to_numpy(y)
        if y.shape != x.shape:
            raise ValueError(f"curve {name!r} has shape {y.shape}, x has {x.shape}")
        line = dict(dash=(dashes or {}).get(name, "solid"))
        fig.add_trace(go.Scatter(x=x, y=y, mode=mode, name=name, line=line,
                                 showlegend=bool(name)))
    fig.update_layout(template=_TEMPLATE, title=title, height=height,
                      xaxis_title=xlabel, yaxis_title=ylabel)
    if log_x:
        fig.update_xaxes(type="log")
    if log_y:
        fig.update_yaxes(type="log")
    return fig


def _format_value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def slider_figure(
    make_figure: Callable[[Any], go.Figure],
    values: Sequence[Any],
    *,
    name: str,
    active: int = 0,
    labels: Optional[Sequence[str]] = None,
) -> go.Figure:
    """Precompute ``make_figure(v)`` for every ``v`` and put them behind one slider.

    Each value's traces are added to one figure; the slider shows one value's
    traces at a time (and its title, if ``make_figure`` sets one). Everything
    lives in the figure itself, so the slider works on a static web page.

    Args:
        make_figure: value -> figure; the layout of ``values[active]`` is used.
        values: the parameter values, in slider order.
        name: the parameter's name shown above the slider.
        active: index of the value shown first.
        labels: tick labels (default: the values).

    Returns:
        one :class:`plotly.graph_objects.Figure` with ``layout.sliders[0]``.
    """
    values = list(values)
    if not values:
        raise ValueError("slider_figure needs at least one value")
    if not 0 <= active < len(values):
        raise ValueError(f"active must index values (0..{len(values) - 1}), got {active}")
    labels = [_format_value(v) for v in values] if labels is None else list(labels)
    if len(labels) != len(values):
        raise ValueError(f"{len(labels)} labels for {len(values)} values")

    figures = [make_figure(v) for v in values]
    combined = go.Figure(layout=figures[active].layout)
    owner = []  # index of the value each trace belongs to
    for index, fig in enumerate(figures):
        for trace in fig.data:
            trace.visible = index == active
            combined.add_trace(trace)
            owner.append(index)

    steps = []
    for index, (fig, label) in enumerate(zip(figures, labels)):
        layout_update: Dict[str, Any] = {}
        if fig.layout.title.text is not None:
            layout_update["title.text"] = fig.layout.title.text
        steps.append(dict(
            method="update",
            label=label,
            args=[{"visible": [o == index for o in owner]}, layout_update],
        ))
    combined.update_layout(
        sliders=[dict(
            active=active,
            steps=steps,
            currentvalue=dict(prefix=f"{name} = ", font=dict(size=13)),
            pad=dict(t=40, b=10),
            len=0.95,
            x=0.025,
        )],
        height=(figures[active].layout.height or 420) + 90,
        margin=dict(b=40),
    )
    return combined


def is_static() -> bool:
    """True when no kernel will answer widget events (``$POSENC_STATIC`` set)."""
    return os.environ.get(STATIC_ENV, "").strip().lower() not in ("", "0", "false", "no")


def interactive(
    make_figure: Callable[..., go.Figure],
    *,
    initial: Optional[Mapping[str, Any]] = None,
    **params: Sequence[Any],
):
    """Sliders over one or more parameters, live in a kernel, precomputed otherwise.

    Args:
        make_figure: keyword arguments (one per parameter) -> figure.
        initial: starting value of some parameters (default: each one's first value).
        **params: ``name=[values ...]`` for each slider, in order.

    Returns:
        In a live kernel, an ipywidgets box of sliders over the figure. On the
        static site (``$POSENC_STATIC``) or without ipywidgets, a
        :func:`slider_figure` over the *first* parameter, the others fixed at
        their initial values.
    """
    if not params:
        raise ValueError("interactive needs at least one parameter, e.g. base=[100, 1000, 10000]")
    values = {name: list(v) for name, v in params.items()}
    for name, v in values.items():
        if not v:
            raise ValueError(f"parameter {name!r} has no values")
    start = {name: v[0] for name, v in values.items()}
    for name, value in (initial or {}).items():
        if name not in values:
            raise ValueError(f"initial value for unknown parameter {name!r}")
        if value not in values[name]:
            raise ValueError(f"initial {name}={value!r} is not one of {values[name]}")
        start[name] = value

    try:
        import ipywidgets as widgets
    except ImportError:  # pragma: no cover - ipywidgets is in requirements.txt
        widgets = None
    if widgets is None or is_static():
        first = next(iter(values))
        others = {n: v for n, v in start.items() if n != first}
        return slider_figure(lambda v: make_figure(**{first: v}, **others), values[first],
                             name=first, active=values[first].index(start[first]))

    from IPython.display import display

    sliders = {
        name: widgets.SelectionSlider(options=v, value=start[name], description=name,
                                      continuous_update=False,
                                      layout=widgets.Layout(width="420px"))
        for name, v in values.items()
    }
    out = widgets.Output()

    def redraw(_change=None):
        with out:
            out.clear_output(wait=True)
            display(make_figure(**{n: s.value for n, s in sliders.items()}))

    for slider in sliders.values():
        slider.observe(redraw, names="value")
    redraw()
    return widgets.VBox([*sliders.values(), out])


class _BookRenderer(MimetypeRenderer):
    """plotly JSON for notebook front ends plus an HTML div for the website.

    While the website is built (``$POSENC_STATIC``) only the HTML is emitted:
    the site's pages have no use for the JSON copy.
    """

    def to_mimebundle(self, fig_dict):
        fig = go.Figure(fig_dict)
        bundle = {} if is_static() else pio.renderers["plotly_mimetype"].to_mimebundle(fig.to_dict())
        bundle["text/html"] = pio.to_html(
            fig, full_html=False, include_plotlyjs=False, include_mathjax=False,
            config=_CONFIG,
        )
        return bundle


def use_book_renderer() -> None:
    """Make ``"posenc"`` plotly's default renderer (kept as ``colab`` on Colab)."""
    if "posenc" not in pio.renderers:
        pio.renderers["posenc"] = _BookRenderer()
    if "google.colab" not in sys.modules:
        pio.renderers.default = "posenc"


use_book_renderer()
