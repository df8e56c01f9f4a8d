// llmtap report: draws the chart specs embedded as JSON (see analysis/html/charts.py) with uPlot.
// Text from the data only ever reaches the page through uPlot's legend (textContent) or canvas text.
(function () {
  "use strict";

  // The web UI's Overview (analysis/static/ui/app.js) calls it with the same payload, from its API.
  window.llmtapDrawCharts = draw_all;
  var embedded = document.getElementById("llmtap-data");
  if (embedded) draw_all(JSON.parse(embedded.textContent));

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
})();
