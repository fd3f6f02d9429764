"""How the book's figures reach a page: the website's HTML and the layout of live figures.

:mod:`posenc.viz` draws the figures, and its ``"posenc"`` plotly renderer
emits each one twice, with this module's help: as plotly's own JSON for
JupyterLab, VS Code and Colab, laid out by :func:`live_layout` (the legend
under the plot, the title wrapped below a band kept for the mode bar), and as
a small HTML ``<div>`` (:func:`_figure_html`) that uses the page's ``Plotly``
object on the website, which loads plotly.js once per page from a local copy
(``figure.js`` fits each figure to its container, narrower on phones). Like
:mod:`posenc.viz`, it depends on nothing else in the library.
"""

from __future__ import annotations

import base64
import json
import math
import os
import re
import uuid
from importlib import resources
from typing import Any, List

try:  # before plotly, whose renderers import it (below): imported after plotly, in a Jupyter kernel, its
    import nbformat  # noqa: F401  JSON-schema checkers took 3 s longer to build (`import posenc`: 4.5 s, not 1.5)
except ImportError:  # plotly's renderers do without it
    pass
import numpy as np
import plotly.graph_objects as go
import plotly.io as pio

STATIC_ENV = "POSENC_STATIC"
_FONT = "system-ui, -apple-system, 'Segoe UI', Roboto, 'Helvetica Neue', Arial, sans-serif"
_CONFIG = {"displaylogo": False, "responsive": True,
           "modeBarButtonsToRemove": ["select2d", "lasso2d", "zoomIn2d", "zoomOut2d", "autoScale2d"]}


def is_static() -> bool:
    """True when no kernel will answer widget events (``$POSENC_STATIC`` set)."""
    return os.environ.get(STATIC_ENV, "").strip().lower() not in ("", "0", "false", "no")


# Draws a figure once plotly.js is on the page (it is loaded deferred, after the
# text) and fits it to its container: below _NARROW px the legend goes under the
# plot (under the slider, if any), titles wrap, sliders take the full width, the
# mode bar is hidden and colour bars are thin. Titles always wrap to keep clear
# of the mode bar. Redrawn when the window is resized. No network, no globals but
# posencPlot.
# Draws a figure once plotly.js has loaded, narrower on phones (see _figure_html); %(narrow)d and
# %(family)s are filled in by _figure_html.
_FIGURE_JS = (resources.files(__package__ or "posenc") / "figure.js").read_text(encoding="utf-8")
_NARROW = 640


def _single(x: Any) -> Any:
    """float64 arrays as float32: half the bytes on the page, and a figure has no use for more digits."""
    if isinstance(x, dict) and x.get("dtype") == "f8" and isinstance(x.get("bdata"), str):
        data = np.frombuffer(base64.b64decode(x["bdata"]), dtype="<f8").astype("<f4")
        return {**x, "dtype": "f4", "bdata": base64.b64encode(data.tobytes()).decode()}
    if isinstance(x, dict):
        return {k: _single(v) for k, v in x.items()}
    return [_single(v) for v in x] if isinstance(x, list) else x


def _figure_html(fig: go.Figure) -> str:
    """``<div>`` + script drawing ``fig`` with the page's plotly.js (see ``_FIGURE_JS``)."""
    spec = fig.to_dict()
    template = spec.get("layout", {}).get("template", {})
    if "data" in template:  # the template's styles for trace types this figure has
        used = {trace.get("type", "scatter") for trace in spec["data"]}
        template["data"] = {k: v for k, v in template["data"].items() if k in used}
    payload = pio.to_json(_single(spec), validate=False).replace("</", "<\\/")
    div = f"posenc-{uuid.uuid4().hex[:12]}"
    script = _FIGURE_JS % {"narrow": _NARROW, "family": json.dumps(_FONT)}
    return (f'<div id="{div}" class="plotly-graph-div" style="height:{fig.layout.height or 450}px; width:100%;"></div>\n'
            f'<script type="text/javascript">{script}\nposencPlot("{div}", {payload}, {json.dumps(_CONFIG)});</script>')


def _legend_rows(names: List[str], room: float) -> int:
    """Rows a horizontal legend of ``names`` takes in ``room`` px (12 px text; as the website's figure.js counts)."""
    rows, used = 1, 0.0
    for name in names:
        width = 46 + 0.6 * 12 * len(name)
        if used and used + width > room:
            rows, used = rows + 1, 0.0
        used += width
    return rows if names else 0


#: Pixels at the top of a live figure kept free for plotly's mode bar (its buttons are 22 px high, 2 px down).
MODEBAR_BAND = 30
#: Widest a live figure's title may be: a phone's notebook (390 px) leaves a figure about 290 px.
TITLE_ROOM = 276
_TITLE_PX = 15
_TITLE_LINE = round(_TITLE_PX * 1.3)


def _wrap_title(text: Any, room: float, px: int = _TITLE_PX) -> Any:
    """``text`` broken with ``<br>`` into balanced lines at most about ``room`` px wide (``px``-px font).

    Math (``$...$``) is left alone: plotly draws it as one piece.
    """
    if not isinstance(text, str) or not text or "$" in text:
        return text
    most = max(12, int(room / (0.56 * px)))  # an average character of a sans-serif font is ~0.5 em wide
    lines = []
    for part in text.split("<br>"):
        visible = len(re.sub(r"<[^>]*>", "", part))
        per_line = min(most, math.ceil(visible / math.ceil(visible / most)) + 4)  # no one-word last line
        line = ""
        for word in part.split(" "):
            visible = len(re.sub(r"<[^>]*>", "", f"{line} {word}" if line else word))
            if line and visible > per_line:
                lines.append(line)
                line = word
            else:
                line = f"{line} {word}" if line else word
        lines.append(line)
    return "<br>".join(lines)


def _live_title(fig: go.Figure, width: int) -> int:
    """Wrap the title (and every slider step's) to ``width`` px, below the mode bar's band; the px added on top."""
    layout = fig.layout
    title = layout.title
    if title.yref == "container" and title.yanchor == "middle":  # done already
        return 0
    steps = [step for slider in layout.sliders for step in slider.steps]
    texts = [title.text] + [step.args[1].get("title.text") for step in steps
                            if len(step.args) > 1 and isinstance(step.args[1], dict)]
    if not any(isinstance(t, str) and t for t in texts):
        return 0
    room = min(width - 24, TITLE_ROOM)
    lines = max(_wrap_title(t, room).count("<br>") + 1 for t in texts if isinstance(t, str) and t)
    for step in steps:
        if len(step.args) > 1 and isinstance(step.args[1], dict) and step.args[1].get("title.text"):
            step.args = [step.args[0], {**step.args[1], "title.text": _wrap_title(step.args[1]["title.text"], room)},
                         *step.args[2:]]
    top = 50 if layout.margin.t is None else layout.margin.t
    needed = MODEBAR_BAND + lines * _TITLE_LINE + 8 + 4
    added = max(0, needed - top)
    # placed by the middle of its lines (plotly centres several lines right, but anchors their top a line off)
    fig.update_layout(title=dict(text=_wrap_title(title.text, room), yref="container", yanchor="middle"),
                      margin=dict(t=top + added), height=(layout.height or 450) + added)
    return added


def live_layout(fig: go.Figure, width: int = 360) -> go.Figure:
    """``fig`` laid out for a notebook whose width is unknown (JupyterLab, Colab, a phone): changed in place.

    The website fits each figure to its width in the browser; a notebook front
    end draws plotly's layout as it is, where a legend on the right leaves a
    phone 100-150 px of plot, and the mode bar (plotly's toolbar, top right)
    covers a long title. Here the title wraps to a phone's width (at most
    :data:`TITLE_ROOM` px) and sits on top of the plot, under a band of
    :data:`MODEBAR_BAND` px kept for the mode bar, the legend
    goes under the plot, in as many rows as the screen needs, and the side
    margins shrink.
    """
    _live_title(fig, width)
    _live_legend(fig, width)
    title = fig.layout.title
    if title.yref == "container" and title.yanchor == "middle" and isinstance(title.text, str):
        lines = title.text.count("<br>") + 1  # plotly draws each line after the first ~7 px lower than centred
        middle = MODEBAR_BAND + 2 + lines * _TITLE_LINE / 2 - 7 * (lines - 1)   # px from the top
        title.y = 1 - middle / (fig.layout.height or 450)
    return fig


def _live_legend(fig: go.Figure, width: int) -> go.Figure:
    """The legend of ``fig`` under the plot, in as many rows as ``width`` px need (see :func:`live_layout`)."""
    layout = fig.layout
    names = [t.name for t in fig.data if t.name and t.showlegend is not False and t.visible is not False]
    shown = layout.showlegend is not False and names and (len(fig.data) > 1 or layout.showlegend
                                                          or any(t.showlegend for t in fig.data))
    if not shown or (layout.legend.orientation == "h" and layout.legend.yref == "container"):
        return fig
    lh = _legend_rows(names, width - 16) * 20 + 8
    bottom = 50 if layout.margin.b is None else layout.margin.b
    slider = 80 if layout.sliders else 0  # a slider sits between the plot and the legend
    fig.update_layout(legend=dict(orientation="h", x=0, xanchor="left", y=0, yanchor="bottom", yref="container",
                                  font=dict(size=12), bgcolor="rgba(255,255,255,0)"),
                      margin=dict(b=bottom + lh + slider, r=min(20 if layout.margin.r is None else layout.margin.r, 20),
                                  l=min(60 if layout.margin.l is None else layout.margin.l, 60)),
                      height=(layout.height or 450) + lh + slider)
    return fig
