// llmtap's overview, the one renderer of `llmtap report --html` (its data embedded as JSON,
// analysis/html/) and of the web UI's Overview (the same data from /_llmtap/api/overview): the KPIs,
// the table per model, the charts (specs of analysis/html/charts.py, drawn with uPlot) and the errors.
// Text from the data reaches the page only as text nodes (textContent), or through uPlot's legend and
// canvas text; never as HTML.
(function () {
  "use strict";

  // -- the page: the data's text as text nodes ----------------------------------------------------------

  function el(tag, cls, children) {
    var node = document.createElement(tag);
    if (cls) node.className = cls;
    [].concat(children == null ? [] : children).forEach(function (c) {
      if (c != null) node.appendChild(c instanceof Node ? c : document.createTextNode(String(c)));
    });
    return node;
  }

  var DASH = "\u2013";
  function fixed(v, digits) { return v.toLocaleString("en-US", { minimumFractionDigits: digits, maximumFractionDigits: digits }); }
  function ms(v) { return v == null ? DASH : Math.abs(v) >= 100 ? fixed(v, 0) : v.toFixed(Math.abs(v) >= 10 ? 1 : 2); }
  function count(v) { return v == null ? DASH : fixed(v, 0); }
  function pct(v) { return v == null ? DASH : (v >= 0.1 || v === 0 ? v.toFixed(1) : v.toFixed(2)) + "%"; }
  function rate(v) { return v == null ? DASH : fixed(v, 1); }
  function tokens(v) {  // 950, 12.3k, 4.56M, 1.2B
    if (v == null) return DASH;
    var units = [[1e9, "B"], [1e6, "M"], [1e3, "k"]];
    for (var i = 0; i < units.length; i++) {
      var scaled = v / units[i][0];
      if (Math.abs(scaled) >= 1) return (scaled < 1000 ? +scaled.toPrecision(3) : fixed(scaled, 0)) + units[i][1];
    }
    return fixed(v, 0);
  }
  function span(seconds) {  // the two largest units: 3 d 4 h, 5 h 12 min, 42 s
    var left = Math.round(seconds), parts = [];
    [["d", 86400], ["h", 3600], ["min", 60], ["s", 1]].forEach(function (u) {
      if (left >= u[1] || (u[0] === "s" && !parts.length)) { parts.push(Math.floor(left / u[1]) + " " + u[0]); left %= u[1]; }
    });
    return parts.slice(0, 2).join(" ");
  }
  function stamp(seconds) { return new Date(seconds * 1000).toISOString().replace("T", " ").slice(0, 19); }

  var NEGATIVE = "* negative: TTFT did not grow with input here (prompt caching, or too little spread in" +
    " input sizes); not a prefill cost.";
  var SUMMARY_HEAD = [["Model", ""], ["Requests", ""], ["Errors", ""], ["TTFT p50", "ms"], ["p90", "ms"], ["p99", "ms"],
    ["TPOT p50", "ms"], ["p99", "ms"], ["E2E p50", "ms"], ["p99", "ms"], ["Tokens/s", "median"],
    ["Prefill", "ms / 1k in"], ["Input", "tokens"], ["Output", "tokens"]];
  var ERROR_HEAD = ["Outcome", "Status", "Error type", "Requests", "Share", "Models", "Example message"];

  function table(cls, head, rows) {
    return el("div", "scroll", el("table", cls, [el("thead", null, el("tr", null, head)), el("tbody", null, rows)]));
  }

  function cell(value, text) {
    var td = el("td", null, text);
    td.setAttribute("data-value", value == null ? "" : String(value));
    return td;
  }

  function kpis(t, counted) {
    var what = counted || "requests";  // what the figures count: "generations" unless every kind was asked for
    var items = [[what.charAt(0).toUpperCase() + what.slice(1), count(t.requests)],
      ["Errors among the " + what, count(t.errors) + " (" + pct(100 * t.errors / t.requests) + ")"],
      ["Models", count(t.models)], ["Input tokens", tokens(t.input_tokens)], ["Output tokens", tokens(t.output_tokens)]];
    return el("section", "head", [
      t.first_s == null ? null : el("p", "range", stamp(t.first_s) + " \u2192 " + stamp(t.last_s) + " UTC (" + span(t.last_s - t.first_s) + ")"),
      el("div", "kpis", items.map(function (k) { return el("div", "kpi", [el("b", null, k[1]), el("span", null, k[0])]); }))]);
  }

  function summary(rows, palette) {
    var body = rows.map(function (r, i) {
      var name = el("th", null, r.model == null ? "All models" : [el("span", "swatch"), r.model]);
      if (r.model != null) name.firstChild.style.background = i < palette.colors.length ? palette.colors[i] : palette.other;
      name.setAttribute("scope", "row");
      var q = function (key, n) { return r[key] ? r[key][n] : null; };
      var slope = r.ttft_ms_per_1k_input;
      var prefill = cell(slope, ms(slope) + (slope < 0 ? "*" : ""));
      if (slope < 0) prefill.title = NEGATIVE;
      var tr = el("tr", r.model == null ? "total" : null, [name, cell(r.requests, count(r.requests)), cell(r.error_pct, pct(r.error_pct)),
        cell(q("ttft_ms", 0), ms(q("ttft_ms", 0))), cell(q("ttft_ms", 1), ms(q("ttft_ms", 1))), cell(q("ttft_ms", 2), ms(q("ttft_ms", 2))),
        cell(q("tpot_ms", 0), ms(q("tpot_ms", 0))), cell(q("tpot_ms", 1), ms(q("tpot_ms", 1))),
        cell(q("e2e_ms", 0), ms(q("e2e_ms", 0))), cell(q("e2e_ms", 1), ms(q("e2e_ms", 1))),
        cell(r.tokens_per_s, rate(r.tokens_per_s)), prefill, cell(r.input_tokens, tokens(r.input_tokens)),
        cell(r.output_tokens, tokens(r.output_tokens))]);
      tr.setAttribute("data-model", r.model == null ? "" : r.model);
      return tr;
    });
    var negative = rows.some(function (r) { return r.ttft_ms_per_1k_input < 0; });
    return el("section", "panel", [el("h2", null, "Per model"),
      el("p", "note", "Latencies and tokens/s over successful requests (TTFT over streams); errors are every outcome" +
        " but ok; prefill is the TTFT slope against input tokens." + (negative ? " " + NEGATIVE : "")),
      table("summary num", SUMMARY_HEAD.map(function (c) { return el("th", null, [c[0], el("small", null, c[1])]); }), body)]);
  }

  function errors(rows, total) {
    if (!rows.length) return null;
    return el("section", "panel", [el("h2", null, "Errors"), table("errors", ERROR_HEAD.map(function (c) { return el("th", null, c); }),
      rows.map(function (r) {
        return el("tr", null, [cell(r.outcome, r.outcome), cell(r.status, r.status == null ? "" : r.status),
          cell(r.error_type, r.error_type || ""), cell(r.n, count(r.n)), cell(null, pct(100 * r.n / total)),
          cell(r.models, r.models), el("td", "msg", r.example || "")]);
      }))]);
  }

  function card(chart) {
    var inner = chart.series.length ? el("div", "chart") : el("div", "empty", "No data for this chart in this selection.");
    inner.id = chart.series.length ? "chart-" + chart.id : "";
    return el("figure", "card", [el("figcaption", null, [el("h2", null, chart.title), chart.note ? el("p", "note", chart.note) : null]), inner]);
  }

  // Fills `root` (keeping what is in it, the report file's extra panels, after the table per model) and
  // draws the charts; returns the uPlot charts drawn.
  function overview(root, d) {
    var t = d.totals, first = root.firstChild;
    if (!t.requests) {
      root.appendChild(el("section", "panel nothing", [el("h2", null, "No requests match this selection"), el("p", null,
        d.filtered ? "No recorded request matches the filter: widen the time window or drop a filter."
          : "The database has no requests yet: send some traffic through llmtap serve.")]));
      return draw_all({ palette: d.palette, other: d.other, charts: [] });
    }
    root.insertBefore(kpis(t, d.counted), first);
    root.insertBefore(summary(d.summary, { colors: d.palette, other: d.other }), first);
    root.appendChild(el("section", "grid", d.charts.map(card)));
    var errs = errors(d.error_table, t.requests);
    if (errs) root.appendChild(errs);
    return draw_all({ palette: d.palette, other: d.other, charts: d.charts.filter(function (c) { return c.series.length; }) });
  }

  // -- the charts ------------------------------------------------------------------------------------------

  function draw_all(payload) {
  var HEIGHT = 300;
  var plots = [];
  window.__llmtapChartsExpected = payload.charts.length;
  window.__llmtapChartsDrawn = 0;
  window.__llmtapYTicks = {};  // chart id -> its y axis labels as last drawn (for tests)

  function color(index) {
    return index >= 0 && index < payload.palette.length ? payload.palette[index] : payload.other;
  }

  function fade(hex, alpha) {
    var n = parseInt(hex.slice(1), 16);
    return "rgba(" + (n >> 16) + "," + ((n >> 8) & 255) + "," + (n & 255) + "," + alpha + ")";
  }

  // uPlot wants one sorted x column shared by all series; ours each have their own x.
  // Points of different series with the same x share a row; the other cells stay null.
  function align(series) {
    var points = [];
    series.forEach(function (s, si) {
      for (var i = 0; i < s.x.length; i++) {
        if (s.x[i] != null && s.y[i] != null) points.push([s.x[i], si, s.y[i]]);
      }
    });
    points.sort(function (a, b) { return a[0] - b[0]; });
    var xs = [];
    var cols = series.map(function () { return []; });
    points.forEach(function (p) {
      var last = xs.length - 1;
      if (last < 0 || xs[last] !== p[0] || cols[p[1]][last] != null) {
        xs.push(p[0]);
        cols.forEach(function (col) { col.push(null); });
        last += 1;
      }
      cols[p[1]][last] = p[2];
    });
    return [xs].concat(cols);
  }

  function compact(v) {
    if (v == null) return "";
    var a = Math.abs(v);
    if (a >= 1e6) return +(v / 1e6).toFixed(2) + "M";
    if (a >= 1e4) return +(v / 1e3).toFixed(1) + "k";
    return +v.toFixed(a < 10 ? 2 : a < 100 ? 1 : 0) + "";
  }

  function fromZero(u, min, max) {
    return [0, max > 0 ? max * 1.05 : 1];
  }

  function pad(n) { return n < 10 ? "0" + n : "" + n; }

  // A UTC time as short as the visible span allows: 14:05:30, 14:05, 06-01 14:05 or 2025-06-01.
  function utcLabel(ts, span) {
    var d = new Date(ts * 1000);
    var hm = pad(d.getUTCHours()) + ":" + pad(d.getUTCMinutes());
    var md = pad(d.getUTCMonth() + 1) + "-" + pad(d.getUTCDate());
    if (span > 0 && span < 600) return hm + ":" + pad(d.getUTCSeconds());
    if (span > 0 && span < 86400) return hm;
    if (span > 0 && span >= 10 * 86400) return d.getUTCFullYear() + "-" + md;
    return md + " " + hm;
  }

  function timeValues(u, splits) {
    var span = u.scales.x.max - u.scales.x.min;
    return splits.map(function (ts) { return utcLabel(ts, span); });
  }

  function axis(label, extra) {
    var base = {
      label: label, labelSize: 20, labelFont: "600 12px system-ui, sans-serif",
      font: "11px system-ui, sans-serif", stroke: "#656d76",
      grid: { stroke: "#eceef1", width: 1 }, ticks: { stroke: "#d5d9de", width: 1, size: 4 },
      values: function (u, splits) { return splits.map(compact); },
    };
    return Object.assign(base, extra || {});
  }

  // A series without a point under the cursor shows nothing in the legend (uPlot's default is "--").
  function legendValue(u, v) { return v == null ? "" : compact(v); }

  function line(s) {
    return { label: s.label, stroke: color(s.color), width: 2, spanGaps: true, points: { show: false },
             value: legendValue };
  }

  // Counts: whole-number ticks only.
  var COUNT_INCRS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1e3, 2e3, 5e3, 1e4, 2e4, 5e4, 1e5, 2e5, 5e5, 1e6, 1e7];

  function scatterOpts(chart) {
    return {
      scales: { x: { time: false, range: fromZero }, y: { range: fromZero } },
      legend: { live: false },
      series: [{}].concat(chart.series.map(function (s) {
        var c = color(s.color);
        return {
          label: s.label, stroke: c, paths: function () { return null; },
          points: { show: true, size: 5, width: 1, stroke: fade(c, 0.9), fill: fade(c, 0.35) },
        };
      })),
      hooks: { draw: [function (u) { drawFits(u, chart); }] },
    };
  }

  // The least-squares line TTFT = intercept + slope * input tokens of each model, over the visible x range.
  function drawFits(u, chart) {
    var ctx = u.ctx;
    var x0 = u.scales.x.min, x1 = u.scales.x.max;
    ctx.save();
    ctx.beginPath();
    ctx.rect(u.bbox.left, u.bbox.top, u.bbox.width, u.bbox.height);
    ctx.clip();
    chart.series.forEach(function (s, i) {
      if (!s.fit || s.fit[0] == null || s.fit[1] == null || !u.series[i + 1].show) return;
      var y = function (x) { return s.fit[0] + s.fit[1] * x / 1000; };
      ctx.beginPath();
      ctx.strokeStyle = color(s.color);
      ctx.lineWidth = 2 * uPlot.pxRatio;
      ctx.setLineDash([6 * uPlot.pxRatio, 4 * uPlot.pxRatio]);
      ctx.moveTo(u.valToPos(x0, "x", true), u.valToPos(y(x0), "y", true));
      ctx.lineTo(u.valToPos(x1, "x", true), u.valToPos(y(x1), "y", true));
      ctx.stroke();
    });
    ctx.restore();
  }

  function cdfOpts(chart) {
    return {
      scales: {
        x: { time: false, range: function (u, min, max) { return fromZero(u, min, chart.xMax || max); } },
        y: { range: [0, 100] },
      },
      legend: { live: false },
      series: [{}].concat(chart.series.map(line)),
    };
  }

  function timeOpts(chart) {
    return {
      tzDate: function (ts) { return uPlot.tzDate(new Date(ts * 1e3), "Etc/UTC"); },
      scales: {
        x: {
          time: true,
          range: function (u, min, max) {  // uPlot widens a single time to 1000 days; minutes read better
            var xs = u.data[0];
            var pad = Math.max(chart.bucket, 300);
            return xs.length > 0 && xs[0] === xs[xs.length - 1] ? [xs[0] - pad, xs[0] + pad] : [min, max];
          },
        },
        y: { range: fromZero },
      },
      series: [{ value: function (u, v) { return v == null ? "" : utcLabel(v, 0); } }]
        .concat(chart.series.map(function (s) {
          var opt = line(s);
          opt.points = { show: true, size: 4 };
          return opt;
        })),
      xAxis: { values: timeValues, space: 70 },
    };
  }

  function stepsOpts(chart) {
    return {
      scales: { x: { time: false, range: fromZero }, y: { range: fromZero } },
      series: [{ label: chart.x, value: legendValue }].concat(chart.series.map(function (s) {
        var opt = line(s);
        opt.paths = uPlot.paths.stepped({ align: 1 });
        opt.fill = fade(color(s.color), 0.06);
        return opt;
      })),
    };
  }

  // Stacked bars: each series is drawn as the running total up to it, tallest first,
  // so the smaller totals paint over it; the legend shows each model's own count.
  function barsOpts(chart, data) {
    var raw = data.slice(1);
    var stacked = [];
    raw.forEach(function (ys, i) {
      stacked.push(ys.map(function (y, j) { return (y || 0) + (i ? stacked[i - 1][j] : 0); }));
    });
    var order = chart.series.map(function (s, i) { return i; }).reverse();
    data.splice(1, data.length - 1);
    order.forEach(function (i) { data.push(stacked[i]); });
    var cats = chart.categories;
    return {
      scales: { x: { time: false, range: [-0.5, cats.length - 0.5] }, y: { range: fromZero } },
      padding: [null, 56, null, null],
      series: [{ label: chart.x || "outcome", value: function (u, v) { return v == null ? "" : cats[v]; } }]
        .concat(order.map(function (i) {
          var c = color(chart.series[i].color);
          return {
            label: chart.series[i].label, stroke: c, fill: c, width: 0,
            paths: uPlot.paths.bars({ size: [0.6, 90] }), points: { show: false },
            value: function (u, v, si, idx) { return idx == null ? "" : raw[i][idx]; },
          };
        })),
      xAxis: {
        splits: function () { return cats.map(function (c, i) { return i; }); },
        values: function (u, splits) { return splits.map(function (i) { return cats[i]; }); },
        rotate: cats.length > 4 ? -25 : 0, size: cats.length > 4 ? 90 : 50, grid: { show: false },
      },
      yAxis: chart.counts === false ? {} : { incrs: COUNT_INCRS },
    };
  }

  var builders = { scatter: scatterOpts, cdf: cdfOpts, time: timeOpts, steps: stepsOpts, bars: barsOpts };

  function draw(chart) {
    var el = document.getElementById("chart-" + chart.id);
    var data = align(chart.series);
    var opts = builders[chart.kind](chart, data);
    var drawn = false;
    opts.width = el.clientWidth || 600;
    opts.height = HEIGHT;
    var yValues = function (u, splits) {
      var labels = splits.map(compact);
      window.__llmtapYTicks[chart.id] = labels;
      return labels;
    };
    opts.axes = [axis(chart.x, opts.xAxis), axis(chart.y, Object.assign({ size: 56, values: yValues }, opts.yAxis))];
    opts.cursor = { points: { size: 6 } };
    opts.hooks = opts.hooks || {};
    opts.hooks.draw = (opts.hooks.draw || []).concat(function () {
      if (!drawn) { drawn = true; window.__llmtapChartsDrawn += 1; }
    });
    delete opts.xAxis;
    delete opts.yAxis;
    plots.push({ el: el, plot: new uPlot(opts, data, el) });
  }

  payload.charts.forEach(function (chart) {
    try {
      draw(chart);
    } catch (err) {
      console.error("llmtap: chart " + chart.id + " failed:", err);
    }
  });

  var pending = null;
  window.addEventListener("resize", function () {
    clearTimeout(pending);
    pending = setTimeout(function () {
      plots.forEach(function (p) {
        if (p.el.isConnected) p.plot.setSize({ width: p.el.clientWidth, height: HEIGHT });
      });
    }, 100);
  });
    return plots;
  }

  window.llmtapOverview = overview;  // the web UI's Overview (analysis/static/ui/app.js)
  var embedded = document.getElementById("llmtap-data");  // the report file
  if (embedded) overview(document.getElementById("overview"), JSON.parse(embedded.textContent));
})();
