window.posencPlot = window.posencPlot || (function () {
  var NARROW = %(narrow)d, FAMILY = %(family)s, ctx = null, figures = [], timer = null;
  function textWidth(text, px) {
    ctx = ctx || document.createElement("canvas").getContext("2d");
    ctx.font = px + "px " + FAMILY;
    return ctx.measureText(String(text).replace(/<[^>]*>/g, "")).width;
  }
  function wrap(text, px, room) {
    if (typeof text !== "string" || !text) return text;
    var lines = [], line = "";
    text.replace(/<br>/g, " ").split(" ").forEach(function (word) {
      var next = line ? line + " " + word : word;
      if (line && textWidth(next, px) > room) { lines.push(line); line = word; } else { line = next; }
    });
    lines.push(line);
    return lines.join("<br>");
  }
  function set(obj, path, value) {
    var keys = path.split("."), last = keys.pop();
    keys.forEach(function (k) { if (typeof obj[k] !== "object" || obj[k] === null) obj[k] = {}; obj = obj[k]; });
    obj[last] = value;
  }
  function legendRows(names, room) {
    var rows = 1, used = 0;
    names.forEach(function (name) {
      var w = 46 + textWidth(name, 12);
      if (used && used + w > room) { rows += 1; used = 0; }
      used += w;
    });
    return names.length ? rows : 0;
  }
  function layoutFor(fig, w, active, out) {
    var L = JSON.parse(JSON.stringify(fig.layout)), narrow = w < NARROW, size = narrow ? 13 : 15;
    var m = L.margin = L.margin || {}, slider = L.sliders && L.sliders[0], steps = slider ? slider.steps || [] : [];
    var room = 0.96 * w - (narrow ? 16 : 170), lines = 0, h0 = L.height || 450, t0 = m.t === undefined ? 50 : m.t;
    var title = L.title && typeof L.title === "object" ? L.title : {text: L.title};
    var texts = [title.text].concat(steps.map(function (s) { return s.args && s.args[1] && s.args[1]["title.text"]; }));
    steps.forEach(function (s) { var u = s.args && s.args[1]; if (u && u["title.text"]) u["title.text"] = wrap(u["title.text"], size, room); });
    texts.forEach(function (t) { if (t) lines = Math.max(lines, wrap(t, size, room).split("<br>").length); });
    title.text = wrap(title.text, size, room);
    title.font = Object.assign({}, title.font, {size: size});
    L.title = title;
    if (slider && active !== null) {
      slider.active = active;
      var u = steps[active] && steps[active].args && steps[active].args[1];
      if (u) Object.keys(u).forEach(function (k) { set(L, k, u[k]); });
    }
    if (lines > 1) m.t = 24 + Math.round(lines * size * 1.35);  // the title sits in the middle of the top margin
    var heat = narrow && fig.data.some(function (t) { return t.type === "heatmap" && t.showscale !== false; });
    if (heat) {  // a phone: the colour bar lies above the plot, under the title
      var block = m.t === undefined ? t0 : m.t;
      m.t = block + 44;
      Object.assign(title, {yref: "container", yanchor: "middle"});
    }
    L.height = h0 + (m.t === undefined ? 0 : m.t - t0);
    if (heat) { title.y = 1 - block / 2 / L.height; out.colorbarY = 1 - (block - 4) / L.height; }
    if (!narrow) return L;
    m.l = Math.min(m.l === undefined ? 60 : m.l, 48);
    m.r = Math.min(m.r === undefined ? 20 : m.r, 8);
    Object.keys(L).forEach(function (k) {
      if (!/^[xy]axis\d*$/.test(k)) return;
      var t = L[k].title = typeof L[k].title === "object" && L[k].title ? L[k].title : {text: L[k].title};
      t.font = Object.assign({}, t.font, {size: 12});
      if (k[0] === "x") t.text = wrap(t.text, 12, w - 70);
      L[k].automargin = true;
    });
    (L.sliders || []).forEach(function (s) {
      var labels = (s.steps || []).map(function (step) { return textWidth(step.label, 10) + 6; });
      var gap = (w - 70) / Math.max(1, labels.length - 1), crowded = labels.some(function (lw, i) {
        return (i && (lw + labels[i - 1]) / 2 > gap) || ((i === 0 || i === labels.length - 1) && lw / 2 > 24);
      });  // crowded tick labels are hidden: the current value is written above the rail
      Object.assign(s, {x: 0, len: 1, font: {size: 10, color: crowded ? "rgba(0,0,0,0)" : "#444"}});
      s.pad = Object.assign({}, s.pad, {l: 0, r: 0});
      s.currentvalue = Object.assign({}, s.currentvalue, {font: {size: 12, color: "#222"}});
    });
    var sets = steps.length ? steps.map(function (s) { return s.args[0].visible; }) : [null];
    var rows = 0;
    if (L.showlegend !== false) sets.forEach(function (visible) {
      var names = fig.data.filter(function (t, i) {
        var shown = visible ? visible[i] : t.visible !== false;
        return shown && t.name && t.showlegend !== false;
      }).map(function (t) { return t.name; });
      if (names.length && (fig.data.length > 1 || L.showlegend || fig.data.some(function (t) { return t.showlegend; }))) rows = Math.max(rows, legendRows(names, w - 16));
    });
    if (rows) {
      var lh = rows * 20 + 8, b0 = slider ? 120 : (m.b === undefined ? 50 : m.b);
      L.legend = Object.assign({}, L.legend, {orientation: "h", x: 0, xanchor: "left", y: 0, yanchor: "bottom",
                                              yref: "container", font: {size: 12}, bgcolor: "rgba(255,255,255,0)"});
      m.b = b0 + lh;
      L.height += lh + (slider ? b0 - 40 : 0);
    }
    return L;
  }
  function dataFor(f, data, out) {
    f.colorbars = f.colorbars || data.map(function (t) { return JSON.stringify(t.colorbar || {}); });
    data.forEach(function (t, i) {
      if (t.type !== "heatmap" || t.showscale === false) return;
      t.colorbar = JSON.parse(f.colorbars[i]);
      if (out.colorbarY !== undefined) Object.assign(t.colorbar, {
        orientation: "h", len: 1, thickness: 10, x: 0.5, xanchor: "center", yref: "container", y: out.colorbarY,
        yanchor: "top", tickfont: {size: 10}, title: Object.assign({}, t.colorbar.title, {side: "right", font: {size: 11}})});
    });
    return data;
  }
  function fit(gd) {  // a legend under a slider: grow the figure if they overlap
    var legend = gd.querySelector("g.legend");
    if (!legend || gd.clientWidth >= NARROW) return;
    var top = legend.getBoundingClientRect().top, bottom = 0;
    gd.querySelectorAll("g.slider-container, g.xtick, g.g-xtitle").forEach(function (el) {
      var r = el.getBoundingClientRect();
      if (r.height) bottom = Math.max(bottom, r.bottom);
    });
    var overlap = Math.ceil(bottom + 6 - top);
    if (overlap > 0) return Plotly.relayout(gd, {height: gd.layout.height + overlap, "margin.b": gd.layout.margin.b + overlap});
  }
  function draw(f, first) {
    var gd = f.gd, w = gd.clientWidth || 600;
    f.width = w;
    var s = gd.layout && gd.layout.sliders && gd.layout.sliders[0], s0 = f.fig.layout.sliders && f.fig.layout.sliders[0];
    var active = s ? s.active || 0 : (s0 ? s0.active || 0 : null);
    var config = Object.assign({}, f.config, {displayModeBar: w < NARROW ? false : "hover"});
    var out = {}, layout = layoutFor(f.fig, w, active, out), data = dataFor(f, first ? f.fig.data : gd.data, out);
    gd.style.height = layout.height + "px";
    return (first ? Plotly.newPlot(gd, data, layout, config) : Plotly.react(gd, data, layout, config))
      .then(function () { return fit(gd); });
  }
  window.addEventListener("resize", function () {
    clearTimeout(timer);
    timer = setTimeout(function () {
      figures.forEach(function (f) { if (Math.abs(f.gd.clientWidth - f.width) > 1) draw(f, false); });
    }, 150);
  });
  return function (id, fig, config) {
    function go() {
      var gd = document.getElementById(id);
      if (!gd || !window.Plotly) return;
      var f = {gd: gd, fig: fig, config: config};
      figures.push(f);
      draw(f, true);
    }
    if (window.Plotly) go();
    else if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", go);
    else window.addEventListener("load", go);
  };
})();
