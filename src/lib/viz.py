"""Figures in one style, sliders that work with and without a kernel.

* :func:`heatmap` and :func:`curves` draw the book's two kinds of figure.
* :func:`slider_figure` precomputes a figure for every value of one parameter
  and stacks them behind a plotly slider: it works on the static website, in
  JupyterLab, VS Code and Colab alike, with no kernel.
* :func:`interactive` gives live ipywidgets sliders in a running kernel (any
  number of parameters; the first one's figures drawn together, with shared
  axes, as on the website) and falls back to :func:`slider_figure` where no
  kernel will answer (the website build sets ``POSENC_STATIC=1``).

Importing this module registers a plotly renderer, ``"posenc"``
(:mod:`posenc._render`), that emits each figure both as plotly's own JSON
(for JupyterLab and VS Code, laid out by :func:`live_layout`) and as a small
HTML ``<div>`` for the website, which loads plotly.js once per page from a
local copy and fits every figure to its container: on a phone the legend goes
below the plot, titles wrap, sliders take the full width and the mode bar is
hidden. On Colab the figure goes through plotly's ``colab`` renderer, laid
out the same way.
"""

from __future__ import annotations

import json
import math
import operator
import sys
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Union

from ._render import _CONFIG, _FONT, STATIC_ENV, _figure_html, is_static, live_layout  # before plotly (see there)

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio
from plotly.io._base_renderers import MimetypeRenderer

__all__ = [
    "PALETTE",
    "SYMBOLS",
    "STATIC_ENV",
    "heatmap",
    "curves",
    "slider_figure",
    "readable_log_axes",
    "interactive",
    "live_layout",
    "is_static",
    "use_book_renderer",
]

#: Okabe-Ito colours (distinguishable with colour-vision deficiencies).
PALETTE = [
    "#0072B2", "#E69F00", "#009E73", "#D55E00",
    "#CC79A7", "#56B4E9", "#F0E442", "#000000",
]

#: Marker symbols that, with dash styles, tell curves apart without colour.
SYMBOLS = ["circle", "square", "diamond", "triangle-up", "x", "triangle-down", "star", "cross"]

_LOG_KEYS = ("exponentformat", "minorloglabels", "dtick")


def _log_ticks(decades: Optional[float]) -> Dict[str, Any]:
    """Tick labels of a log axis spanning ``decades``: never a bare "3" for 0.03, nor "100μ"."""
    if decades is not None and decades <= 3.5:  # plain numbers: 0.02, 0.05, 0.1, 0.2 ...
        return dict(exponentformat="none", minorloglabels="complete", dtick="D2" if decades > 1 else None)
    return dict(exponentformat="power", minorloglabels="none")  # 10^-6, 10^-5 ... unlabelled minor ticks

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


def _tensor_to_numpy(t: Any) -> np.ndarray:
    t = t.detach().cpu()
    if t.is_floating_point() and t.element_size() < 4:  # bfloat16, float8 (no numpy dtype) and float16
        t = t.float()
    return t.numpy()


def _to_numpy(a: ArrayLike) -> np.ndarray:
    """``a`` as a numpy array: tensors (any device; bfloat16 and other half floats as float32), lists of them."""
    if hasattr(a, "detach"):  # torch tensor
        return np.asarray(_tensor_to_numpy(a))
    if isinstance(a, (list, tuple)) and any(hasattr(v, "detach") for v in a):  # e.g. a list of 0-d tensors
        return np.asarray([_tensor_to_numpy(v) if hasattr(v, "detach") else v for v in a])
    return np.asarray(a)


def _real(name: str, a: ArrayLike) -> np.ndarray:
    """``a`` as a NumPy array of real numbers, else ``ValueError`` (plotly would fail only when the figure is drawn)."""
    out = _to_numpy(a)
    if out.dtype == object and all(v is None or (isinstance(v, (int, float, np.number)) and not isinstance(v, complex))
                                   for v in out.ravel()):
        out = out.astype(float)  # None: a gap in the curve (NaN)
    if out.dtype.kind not in "biuf":
        hint = (" (a posenc.Spread per point? pass its .mean, and its .low and .high as ranges=)"
                if any(hasattr(v, "values") and hasattr(v, "mean") for v in out.ravel()[:1]) else "")
        raise ValueError(f"{name} must hold real numbers, got {out.dtype} values{hint}")
    return out


def _check_flag(name: str, value: Any) -> bool:
    """``value`` as a bool (NumPy's too), else ``ValueError``: a truthy string such as ``"no"`` is no ``True``."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise ValueError(f"{name} must be True or False, got {value!r}")


def _check_labels(name: str, labels: Any, cells: int, what: str) -> Optional[np.ndarray]:
    """Axis labels as a 1-D array of ``cells`` labels (or ``cells + 1`` cell edges), else ``ValueError``."""
    if labels is None:
        return None
    labels = _to_numpy(labels)
    if labels.ndim != 1 or len(labels) not in (cells, cells + 1):
        raise ValueError(f"{name} must hold one label per {what} of z ({cells}, or {cells + 1} cell edges), "
                         f"got shape {labels.shape}")
    return labels


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
    """A 2-D array as a heatmap, row 0 at the top (like a matrix) by default.

    ``x`` / ``y``: one label per column / row of ``z`` (or one more: the cells' edges);
    any other length raises ``ValueError`` (plotly would label the cells wrongly).
    """
    z = _real("z", z)
    if z.ndim != 2:
        raise ValueError(f"heatmap needs a 2-D array, got shape {z.shape}")
    reversed_y = _check_flag("reversed_y", reversed_y)
    trace = go.Heatmap(
        z=z,
        x=_check_labels("x", x, z.shape[1], "column"),
        y=_check_labels("y", y, z.shape[0], "row"),
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
    styles: Optional[Mapping[str, Mapping[str, str]]] = None,
    ranges: Optional[Mapping[str, Sequence[ArrayLike]]] = None,
    height: int = 400,
) -> go.Figure:
    """One or more curves over the same ``x``.

    Args:
        ys: a mapping ``name -> values`` (one legend entry each) or one array.
        dashes: optional ``name -> dash style`` (``"dot"``, ``"dash"``, ...).
        styles: optional ``name -> {"color", "dash", "symbol"}`` (any of the
            three), so that curves differ by more than their colour.
        ranges: optional ``name -> (low, high)``, arrays like ``x``: drawn as
            error bars around the curve (the min-max range over seeds, say);
            ``low <= y <= high`` is required.
    """
    x = _to_numpy(x)
    log_x, log_y = _check_flag("log_x", log_x), _check_flag("log_y", log_y)
    if not isinstance(ys, Mapping):
        ys = {"": ys}
    unknown = set(ranges or {}) - set(ys)
    if unknown:
        raise ValueError(f"ranges for curves that are not drawn: {sorted(unknown)}")
    fig = go.Figure()
    for name, y in ys.items():
        y = _real(f"curve {name!r}", y)
        if y.shape != x.shape:
            raise ValueError(f"curve {name!r} has shape {y.shape}, x has {x.shape}")
        error = {}
        if name in (ranges or {}):
            low, high = _range_pair(name, ranges[name], y)
            error = dict(error_y=dict(type="data", symmetric=False, array=high - y, arrayminus=y - low,
                                      thickness=1.5, width=4))
        style = dict((styles or {}).get(name, {}))
        line = dict(dash=style.get("dash", (dashes or {}).get(name, "solid")))
        marker = {}
        if "color" in style:
            line["color"] = marker["color"] = style["color"]
        if "symbol" in style:
            marker["symbol"] = style["symbol"]
        fig.add_trace(go.Scatter(x=x, y=y, mode=mode, name=name, line=line, marker=marker,
                                 showlegend=bool(name), **error))
    fig.update_layout(template=_TEMPLATE, title=title, height=height,
                      xaxis_title=xlabel, yaxis_title=ylabel)
    if log_x:  # a few lengths a factor >= 1.5 apart: a tick at each (plain numbers, no crowding)
        ticks = np.unique(x[np.isfinite(x) & (x > 0)]) if x.ndim == 1 else np.array([])
        spread = 1 < len(ticks) <= 10 and (ticks[1:] / ticks[:-1]).min() >= 1.5
        fig.update_xaxes(type="log", **(dict(tickvals=ticks.tolist(), ticktext=[f"{t:g}" for t in ticks]) if spread else {}))
    if log_y:
        fig.update_yaxes(type="log")
    return readable_log_axes(fig)


def _range_pair(name: str, pair: Any, y: np.ndarray) -> tuple:
    """``(low, high)`` of curve ``name`` as arrays like ``y``, with ``low <= y <= high``."""
    if not isinstance(pair, (tuple, list)) or len(pair) != 2:
        raise ValueError(f"ranges[{name!r}] must be a pair (low, high), got {type(pair).__name__}")
    low, high = (_to_numpy(a).astype(float) for a in pair)
    if low.shape != y.shape or high.shape != y.shape:
        raise ValueError(f"ranges[{name!r}] must have the shape of its curve {y.shape}, got {low.shape}, {high.shape}")
    tol = 1e-9 * np.maximum(1.0, np.abs(y))
    if not (np.all(low <= y + tol) and np.all(y <= high + tol)):
        raise ValueError(f"ranges[{name!r}] must enclose its curve: low <= y <= high")
    return low, high


def _axis_names(layout: Any) -> list:
    return sorted(k for k in layout.to_plotly_json() if k[1:5] == "axis" and k[0] in "xy")


def readable_log_axes(fig: go.Figure) -> go.Figure:
    """Give every log axis of ``fig`` readable tick labels.

    Up to 3.5 decades the ticks are plain numbers (0.02, 0.05, 0.1 ...), beyond
    that powers of ten with unlabelled minor ticks. Settings the figure already
    has are kept. :func:`curves`, :func:`slider_figure` and the book's renderer
    call it, so every figure of the book gets it.
    """
    for name in _axis_names(fig.layout):
        axis = fig.layout[name]
        if axis.type == "log":
            extent = list(axis.range) if axis.range is not None else _data_range(fig, name, True)
            ticks = _log_ticks(None if extent is None else extent[1] - extent[0])
            axis.update({k: v for k, v in ticks.items() if axis[k] is None and v is not None})
    return fig


def _format_value(value: Any) -> str:
    """A slider label, as the figures' titles write numbers with ``:g``: 0.25, 10000 (for 10000.0), 1e+06.

    An integer keeps all its digits unless ``:g`` writes it exactly (1048576 stays, 1000000 is 1e+06).
    """
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10 ** 6 and float(f"{value:g}") == value:
        return f"{value:g}"
    return str(value)


def _step_layout(fig: go.Figure) -> Dict[str, Any]:
    """The layout a slider step may change, as ``plotly.relayout`` keys."""
    readable_log_axes(fig)
    state: Dict[str, Any] = {"title.text": fig.layout.title.text}
    for name in _axis_names(fig.layout):
        axis = fig.layout[name]
        state[f"{name}.title.text"] = axis.title.text
        state[f"{name}.type"] = axis.type
        state[f"{name}.range"] = None if axis.range is None else list(axis.range)
        state.update({f"{name}.{k}": axis[k] for k in _LOG_KEYS if axis[k] is not None})
    for key in ("shapes", "annotations"):
        state[key] = [item.to_plotly_json() for item in fig.layout[key]]
    return state


def _extent(values: Any, log: bool) -> Optional[tuple]:
    try:
        a = np.asarray(_to_numpy(values), dtype=float).ravel()
    except (TypeError, ValueError):  # categories: no numeric range
        return None
    a = a[np.isfinite(a) & (a > 0)] if log else a[np.isfinite(a)]
    if not a.size:
        return None
    return (math.log10(a.min()), math.log10(a.max())) if log else (float(a.min()), float(a.max()))


def _data_range(fig: go.Figure, name: str, log: bool) -> Optional[list]:
    """``[low, high]`` of the data of ``fig`` on axis ``name`` (log10 units on a log axis), padded like plotly."""
    letter, ref = name[0], name[0] + name[5:]
    low, high, pad = math.inf, -math.inf, letter == "y"
    for trace in fig.data:
        if (trace[f"{letter}axis"] or letter) != ref:
            continue
        if trace.type not in ("scatter", "scattergl", "bar"):
            return None  # a heatmap's axes follow its cells
        values = trace[letter]
        if values is None:
            other = trace["y" if letter == "x" else "x"]
            values = np.arange(len(other)) if other is not None else []
        extent = _extent(values, log)
        error = trace[f"error_{letter}"]
        if extent is not None and error is not None and error.array is not None:  # error bars: their ends too
            v = np.asarray(_to_numpy(values), dtype=float)
            up = np.asarray(error.array, dtype=float)
            down = up if error.arrayminus is None or error.symmetric else np.asarray(error.arrayminus, dtype=float)
            ends = [_extent(v + up, log), _extent(v - down, log)]
            extent = (min([extent[0]] + [e[0] for e in ends if e]), max([extent[1]] + [e[1] for e in ends if e]))
        if extent is not None:
            low, high = min(low, extent[0]), max(high, extent[1])
        if trace.type == "bar" and letter == ("x" if trace.orientation == "h" else "y") and not log:
            low, high = min(low, 0.0), max(high, 0.0)
        pad = pad or "markers" in (trace.mode or "")
    if low > high:
        return None
    if fig.layout[name].rangemode == "tozero" and not log:
        low, high = min(low, 0.0), max(high, 0.0)
    margin = 0.05 * (high - low) if high > low else (0.5 if log else max(1.0, abs(low)) * 0.05)
    return [low - margin, high + margin] if pad else [low, high]


def _pin_ranges(figures: List[go.Figure], states: List[Dict[str, Any]]) -> List[str]:
    """Give every axis that shows the same quantity (title and type) in several figures the range of all their data.

    ``states`` (the figures' :func:`_step_layout`) are updated in place; returns the
    layout keys set (``"xaxis.range"``, ``"xaxis.autorange"``, ...).
    """
    axes = sorted({k[: -len(".range")] for state in states for k in state if k.endswith(".range")})
    pinned: List[str] = []  # the range keys every step sets
    for axis in axes:
        if any(fig.layout[axis].autorange is not None for fig in figures):
            continue  # e.g. a heatmap's reversed y axis
        groups: Dict[Any, list] = {}
        for index, state in enumerate(states):
            key = (state.get(f"{axis}.title.text"), state.get(f"{axis}.type"))
            groups.setdefault(key, []).append(index)
        for members in groups.values():
            log = states[members[0]].get(f"{axis}.type") == "log"
            ranges = [_data_range(figures[i], axis, log) for i in members if states[i][f"{axis}.range"] is None]
            if None in ranges or not ranges:
                continue  # a heatmap, categories or nothing to fit: plotly fits each step
            shared = [min(r[0] for r in ranges), max(r[1] for r in ranges)]
            for i in members:
                if states[i][f"{axis}.range"] is None:
                    states[i][f"{axis}.range"] = shared
        if any(state[f"{axis}.range"] is not None for state in states):
            for state in states:
                state[f"{axis}.autorange"] = state[f"{axis}.range"] is None
            pinned += [f"{axis}.range", f"{axis}.autorange"]
    return pinned


def _slider_values(name: str, values: Any) -> List[Any]:
    """A slider's values as a non-empty list, else ``ValueError`` (a single number or a string is no list)."""
    listed = None
    if not isinstance(values, (str, bytes)):
        try:
            listed = list(values)
        except TypeError:  # a number, a 0-d array or tensor
            pass
    if listed is None:
        raise ValueError(f"{name} must be a list of the slider's values, e.g. [100, 1000, 10000], got {values!r}")
    values = listed
    if not values:
        raise ValueError(f"{name} must hold at least one value for the slider, got none")
    return values


def _active_index(active: Any, size: int) -> int:
    """``active`` as an index of ``size`` values (an integer of Python, NumPy or a 0-d tensor; not a bool),
    else ``ValueError``."""
    index = None
    if not str(getattr(active, "dtype", type(active).__name__)).endswith("bool"):  # bool, NumPy's, a bool tensor
        try:
            index = operator.index(active)
        except TypeError:
            pass
    if index is None or not 0 <= index < size:
        raise ValueError(f"active must be an integer index of values (0..{size - 1}), got {active!r}")
    return index


def slider_figure(
    make_figure: Callable[[Any], go.Figure],
    values: Sequence[Any],
    *,
    name: str,
    active: int = 0,
    labels: Optional[Sequence[str]] = None,
    fixed_ranges: bool = True,
) -> go.Figure:
    """Precompute ``make_figure(v)`` for every ``v`` and put them behind one slider.

    Each value's traces are added to one figure; the slider shows one value's
    traces at a time, with that value's title, axis titles, axis types, shapes
    and annotations (each step carries the layout it changes). Everything
    lives in the figure itself, so the slider works on a static web page.

    Axes keep their range from step to step, so that the steps can be compared:
    a step's own ``range`` is kept, and an axis without one gets the range of the
    data of every step that shows the same quantity (same axis title and type).

    Args:
        make_figure: value -> figure; the layout of ``values[active]`` is used.
        values: the parameter values, in slider order.
        name: the parameter's name shown above the slider.
        active: index of the value shown first.
        labels: tick labels (default: the values).
        fixed_ranges: ``False`` lets every step fit the axes to its own data.

    Returns:
        one :class:`plotly.graph_objects.Figure` with ``layout.sliders[0]``.
    """
    values = _slider_values("values", values)
    active = _active_index(active, len(values))
    fixed_ranges = _check_flag("fixed_ranges", fixed_ranges)
    labels = [_format_value(v) for v in values] if labels is None else list(labels)
    if len(labels) != len(values):
        raise ValueError(f"{len(labels)} labels for {len(values)} values")

    figures = [make_figure(v) for v in values]
    wrong = [type(f).__name__ for f in figures if not isinstance(f, go.Figure)]
    if wrong:
        raise ValueError(f"make_figure must return a plotly Figure for every value, got {wrong[0]}")
    states = [_step_layout(fig) for fig in figures]
    pinned = _pin_ranges(figures, states) if fixed_ranges else []
    # Each step carries what differs between the steps, and the ranges fixed above.
    every = list(dict.fromkeys(k for state in states for k in state))
    keys = [k for k in every if k in pinned
            or any(json.dumps(st.get(k), default=str) != json.dumps(states[active].get(k), default=str)
                   for st in states)]
    if any(k.endswith(".range") and k not in pinned for k in keys):  # ranges differ but were not fixed
        keys += [k[: -len("range")] + "autorange" for k in keys if k.endswith(".range") and k not in pinned]
        for state in states:
            state.update({k[: -len("range")] + "autorange": state[k] is None for k in keys if k.endswith(".range")})

    combined = go.Figure(layout=figures[active].layout)
    owner = []  # index of the value each trace belongs to
    for index, fig in enumerate(figures):
        for trace in fig.data:
            trace.visible = index == active
            combined.add_trace(trace)
            owner.append(index)
    for key in pinned:
        combined.update_layout({key.replace(".", "_"): states[active][key]})

    steps = [dict(method="update", label=label,
                  args=[{"visible": [o == index for o in owner]}, {k: state.get(k) for k in keys}])
             for index, (state, label) in enumerate(zip(states, labels))]
    combined.update_layout(
        sliders=[dict(active=active, steps=steps, currentvalue=dict(prefix=f"{name} = ", font=dict(size=13)),
                      pad=dict(t=40, b=10), len=0.95, x=0.025)],
        height=(figures[active].layout.height or 420) + 90,
        margin=dict(b=40),
    )
    return readable_log_axes(combined)


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
        In a live kernel, an ipywidgets box of sliders over the figure: as on
        the website, the figures for every value of the *first* parameter are
        drawn together (for the others' current values) and share their axis
        ranges, so moving that slider compares like with like and costs no
        recomputation. On the static site (``$POSENC_STATIC``) or without
        ipywidgets, a :func:`slider_figure` over the first parameter, the
        others fixed at their initial values.
    """
    if not params:
        raise ValueError("interactive needs at least one parameter, e.g. base=[100, 1000, 10000]")
    values = {name: _slider_values(f"parameter {name!r}", v) for name, v in params.items()}
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

    def labelled(v: List[Any]) -> list:  # readouts as the titles write the values (1e+06, not 1000000)
        labels = [_format_value(x) for x in v]
        return list(zip(labels, v)) if len(set(labels)) == len(labels) else v

    sliders = {
        name: widgets.SelectionSlider(options=labelled(v), value=start[name], description=name,
                                      continuous_update=False, style={"description_width": "initial"},
                                      layout=widgets.Layout(width="100%", max_width="420px"))
        for name, v in values.items()
    }
    out = widgets.Output()
    first = next(iter(values))
    drawn: Dict[Any, List[go.Figure]] = {}  # the figures over the first parameter, for the others' current values

    def figure_now() -> go.Figure:
        others = {n: s.value for n, s in sliders.items() if n != first}
        key = json.dumps(others, sort_keys=True, default=repr)
        if key not in drawn:  # as on the website: every value of the first parameter, axes fixed over all of them
            figures = [make_figure(**{first: v}, **others) for v in values[first]]
            states = [_step_layout(fig) for fig in figures]
            pinned = _pin_ranges(figures, states)
            for fig, state in zip(figures, states):
                fig.update_layout({k.replace(".", "_"): state[k] for k in pinned})
            drawn.clear()
            drawn[key] = figures
        return drawn[key][values[first].index(sliders[first].value)]

    def redraw(_change=None):
        with out:
            out.clear_output(wait=True)
            display(figure_now())

    for slider in sliders.values():
        slider.observe(redraw, names="value")
    redraw()
    return widgets.VBox([*sliders.values(), out])


class _BookRenderer(MimetypeRenderer):
    """plotly JSON for notebook front ends plus an HTML div for the website.

    While the website is built (``$POSENC_STATIC``) only the HTML is emitted:
    the site's pages have no use for the JSON copy (the book's extension puts
    it back, from the HTML, into the executed notebooks it offers for download).
    """

    def to_mimebundle(self, fig_dict):
        fig = readable_log_axes(go.Figure(fig_dict))
        if "google.colab" in sys.modules:  # Colab draws its own renderer's HTML (plotly.js from its CDN)
            return pio.renderers["colab"].to_mimebundle(live_layout(fig).to_dict())
        bundle = {}
        if not is_static():
            bundle = pio.renderers["plotly_mimetype"].to_mimebundle(live_layout(go.Figure(fig)).to_dict())
            bundle["application/vnd.plotly.v1+json"]["config"] = dict(_CONFIG)  # JupyterLab's plotly reads it
        bundle["text/html"] = _figure_html(fig)
        return bundle


def use_book_renderer() -> None:
    """Make ``"posenc"`` plotly's default renderer (on Colab it wraps Colab's own, with :func:`live_layout`)."""
    if "posenc" not in pio.renderers:
        pio.renderers["posenc"] = _BookRenderer()
    pio.renderers.default = "posenc"


use_book_renderer()
