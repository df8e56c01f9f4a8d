// llmtap web UI (docs/ui.md): one page, a view per hash route, reading /_llmtap/api/* and /_llmtap/live.
// Every text from the data reaches the page as a text node (textContent), never as HTML; it loads
// nothing but this proxy's own files. Its session (proxy/relay/ui_doors.py) is kept in this origin's
// sessionStorage and sent in a header: never a cookie, which every port of the host would receive.
(function () {
  "use strict";

  var API = "/_llmtap/api/";
  var main = document.getElementById("main");
  var statusLine = document.getElementById("status");
  var SESSION = "llmtap_ui", SESSION_HEADER = "X-Llmtap-Ui";
  var live = null;  // the Live page's feed (a streamed fetch), closed when another page shows
  var plots = [];   // uPlot charts of the page shown, destroyed when another shows

  // -- DOM, as text -------------------------------------------------------------------------------

  function h(tag, attrs) {
    var el = document.createElement(tag);
    if (attrs) {
      Object.keys(attrs).forEach(function (k) {
        var v = attrs[k];
        if (v == null || v === false) return;
        if (k.slice(0, 2) === "on") el.addEventListener(k.slice(2), v);
        else if (k === "text") el.textContent = String(v);
        else el.setAttribute(k, v === true ? "" : String(v));
      });
    }
    for (var i = 2; i < arguments.length; i++) add(el, arguments[i]);
    return el;
  }

  function add(el, child) {
    if (child == null || child === false) return;
    if (Array.isArray(child)) { child.forEach(function (c) { add(el, c); }); return; }
    el.appendChild(child instanceof Node ? child : document.createTextNode(String(child)));
  }

  function show() {
    while (main.firstChild) main.removeChild(main.firstChild);
    for (var i = 0; i < arguments.length; i++) add(main, arguments[i]);
  }

  // -- formats --------------------------------------------------------------------------------------

  function ms(v) {
    if (v == null) return "–";
    var a = Math.abs(v);
    if (a < 10) return v.toFixed(1) + " ms";
    if (a < 1000) return Math.round(v) + " ms";
    if (a < 60000) return (v / 1000).toFixed(2) + " s";
    return (v / 60000).toFixed(1) + " min";
  }
  function secs(v) { return v == null ? "open" : ms(v * 1000); }
  function count(v) { return v == null ? "–" : Number(v).toLocaleString("en-US"); }
  function usd(v) { return v == null ? "–" : "$" + (v < 0.01 ? v.toFixed(4) : v.toFixed(2)); }
  function pct(part, whole) { return whole > 0 ? Math.round(100 * part / whole) + "%" : "–"; }
  function when(iso) {
    if (!iso) return "–";
    var d = new Date(typeof iso === "number" ? iso * 1000 : iso);
    return isNaN(d) ? String(iso) : d.toISOString().replace("T", " ").slice(0, 19);
  }
  function short(id) { return id ? String(id).slice(0, 10) : "–"; }
  // a session's key as `llmtap sessions` prints it (13 characters and "…": a UUID cut at its hyphen),
  // which `llmtap session` takes back
  function shortKey(key) { return !key ? "–" : key.length > 14 ? key.slice(0, 13) + "…" : key; }
  function plural(n, one) { return n + " " + one + (n === 1 ? "" : "s"); }

  // A table cell keeps its raw value in data-value, for tests and for copy; the text is formatted.
  function cell(value, text, cls) {
    return h("td", { "class": cls || null, "data-value": value == null ? "" : String(value) }, text);
  }

  function table(head, rows, opts) {
    opts = opts || {};
    var thead = h("thead", null, h("tr", null, head.map(function (c) {
      return typeof c === "string" ? h("th", { scope: "col" }, c) : c;
    })));
    return h("div", { "class": "scroll" }, h("table", { "class": opts.cls || null, "aria-label": opts.label || null },
      thead, h("tbody", null, rows)));
  }

  function facts(pairs) {
    var dl = h("dl", { "class": "facts" });
    pairs.forEach(function (p) {
      if (p[1] == null || p[1] === "") return;
      add(dl, [h("dt", null, p[0]), h("dd", { "data-key": p[2] || null }, p[1])]);
    });
    return dl;
  }

  function kpi(label, value) { return h("div", { "class": "kpi" }, h("b", null, value), h("span", null, label)); }

  function link(href, text) { return h("a", { href: href }, text); }

  function status(text) { statusLine.textContent = text || ""; }

  // -- the API ---------------------------------------------------------------------------------------

  function query(params) {
    var parts = [];
    Object.keys(params || {}).forEach(function (k) {
      var v = params[k];
      (Array.isArray(v) ? v : [v]).forEach(function (one) {
        if (one != null && one !== "") parts.push(encodeURIComponent(k) + "=" + encodeURIComponent(one));
      });
    });
    return parts.length ? "?" + parts.join("&") : "";
  }

  function fetchJson(path, params) {
    return fetch(API + path + query(params), { credentials: "omit", headers: authorized({ Accept: "application/json" }) })
      .then(function (r) {
        return r.json().catch(function () { return { error: "HTTP " + r.status }; }).then(function (body) {
          if (!r.ok) throw Object.assign(new Error(body && body.error ? body.error : "HTTP " + r.status), { status: r.status });
          return body;
        });
      });
  }

  // -- the session: a one-time ticket in the fragment (#login=T, never sent to a server), traded once
  // for a session kept in sessionStorage (this origin's alone) and sent in a header ---------------------

  function authorized(headers) {
    headers[SESSION_HEADER] = sessionStorage.getItem(SESSION) || "";
    return headers;
  }

  function login() {
    var m = /^#login=([A-Za-z0-9_-]+)$/.exec(location.hash);
    if (!m) return Promise.resolve();
    history.replaceState(null, "", location.pathname + "#/live");  // the ticket leaves the address bar
    return fetch("/_llmtap/ui/login", { method: "POST", credentials: "omit", headers: { "Content-Type": "application/json" },
                                        body: JSON.stringify({ ticket: m[1] }) })
      .then(function (r) {
        return r.json().then(function (body) {
          if (!r.ok) throw new Error(body && body.error ? body.error : "HTTP " + r.status);
          sessionStorage.setItem(SESSION, body.session);
        });
      });
  }

  // The live feed (server-sent events) read from a fetch, which can send the session header (an
  // EventSource cannot); reopened after a pause if it breaks, as an EventSource would be.
  function feed(url, onEvent, onBroken) {
    var stopped = false, controller = null, retry = null;
    function open() {
      controller = new AbortController();
      fetch(url, { credentials: "omit", headers: authorized({ Accept: "text/event-stream" }), signal: controller.signal })
        .then(function (r) {
          if (!r.ok || !r.body) throw new Error("HTTP " + r.status);
          var reader = r.body.getReader(), decoder = new TextDecoder(), buffer = "";
          function pump() {
            return reader.read().then(function (chunk) {
              if (chunk.done) throw new Error("the feed ended");
              buffer += decoder.decode(chunk.value, { stream: true });
              var at;
              while ((at = buffer.indexOf("\n\n")) >= 0) {
                dispatch(buffer.slice(0, at));
                buffer = buffer.slice(at + 2);
              }
              return pump();
            });
          }
          return pump();
        })
        .catch(function () {
          if (stopped) return;
          onBroken();
          retry = setTimeout(open, 2000);
        });
    }
    function dispatch(block) {
      var name = "message", data = [];
      block.split("\n").forEach(function (line) {
        if (line.slice(0, 6) === "event:") name = line.slice(6).trim();
        else if (line.slice(0, 5) === "data:") data.push(line.slice(5).replace(/^ /, ""));
      });
      if (data.length && !stopped) onEvent(name, data.join("\n"));
    }
    open();
    return { close: function () { stopped = true; clearTimeout(retry); if (controller) controller.abort(); } };
  }

  // The page's answers: one for a page already left (a slow Overview, then Requests) never settles,
  // so it is not drawn over the page shown now. `window.__llmtapAnswers` counts the answers come
  // (kept or dropped), for the tests.
  var view = 0;
  function get(path, params) {
    var mine = view;
    function settle(keep) {
      window.__llmtapAnswers = (window.__llmtapAnswers || 0) + 1;
      return mine === view ? keep() : new Promise(function () {});
    }
    return fetchJson(path, params).then(function (body) { return settle(function () { return body; }); },
                                        function (err) { return settle(function () { throw err; }); });
  }

  // No session (a bookmark, another browser or tab) or one the proxy no longer takes (it restarted,
  // its hours passed): the way in, in words.
  function loggedOut(why) {
    sessionStorage.removeItem(SESSION);
    status("");
    show(h("h1", { id: "logged-out" }, "Not logged in"),
         h("p", null, why || "This tab has no llmtap session."),
         h("p", null, "Run ", h("code", null, "llmtap ui"), " in a terminal: it opens this page logged in, with a one-time link" +
           " (each browser tab logs in once; the link works once, for two minutes)."),
         h("p", { "class": "muted" }, "More than one llmtap serve on this machine? ", h("code", null, "llmtap ui"),
           " says which one it opened; ", h("code", null, "--url"), " picks another."));
  }

  function failed(err) {
    if (err && err.status === 403) { loggedOut("The proxy no longer takes this tab's session (it restarted, or its hours passed)."); return; }
    show(h("p", { "class": "error", role: "alert" }, String(err && err.message || err)),
         h("p", { "class": "muted" }, "Logged out? Run `llmtap ui` again for a new login link."));
  }

  // -- routing ---------------------------------------------------------------------------------------

  function route() {
    var hash = location.hash.replace(/^#\/?/, "");
    var q = hash.indexOf("?");
    var path = q < 0 ? hash : hash.slice(0, q);
    var params = {};
    new URLSearchParams(q < 0 ? "" : hash.slice(q + 1)).forEach(function (v, k) { params[k] = v; });
    var parts = path.split("/");
    return { page: parts[0] || "live", arg: decodeURIComponent(parts.slice(1).join("/")), params: params };
  }

  function go(page, params) { location.hash = "#/" + page + query(params); }

  function render() {
    view += 1;
    if (live) { live.close(); live = null; }
    plots.forEach(function (p) { p.destroy(); });
    plots = [];
    status("");
    var r = route();
    document.querySelectorAll("nav a").forEach(function (a) {
      var on = a.getAttribute("data-page") === r.page || (a.getAttribute("data-page") + "" === "requests" && r.page === "request")
        || (a.getAttribute("data-page") === "sessions" && r.page === "session");
      if (on) a.setAttribute("aria-current", "page"); else a.removeAttribute("aria-current");
    });
    var pages = { live: livePage, requests: requestsPage, request: requestPage, sessions: sessionsPage,
                  session: sessionPage, overview: overviewPage, compare: comparePage };
    (pages[r.page] || livePage)(r.arg, r.params);
    document.title = "llmtap · " + r.page;
  }

  // -- Live --------------------------------------------------------------------------------------------

  var FINISHED_KEPT = 200;

  function livePage() {
    var inflight = h("tbody");
    var finished = h("tbody");
    show(h("h1", null, "Live"),
      h("p", { "class": "muted" }, "Requests in flight (updated four times a second) and the last " + FINISHED_KEPT +
        " finished, newest first. Batched: one update per tick, never one per chunk."),
      h("h2", null, "In flight"),
      h("div", { "class": "scroll" }, h("table", { id: "inflight", "aria-label": "In flight" },
        h("thead", null, h("tr", null, ["id", "model", "tool", "elapsed", "TTFT", "events", "tokens", "tokens/s"]
          .map(function (c, i) { return h("th", { scope: "col", "class": i > 2 ? "num" : null }, c); }))), inflight)),
      h("h2", null, "Finished"),
      h("div", { "class": "scroll" }, h("table", { id: "finished", "aria-label": "Finished" },
        h("thead", null, h("tr", null, ["started (UTC)", "id", "model", "tool", "kind", "outcome", "status", "TTFT",
          "E2E", "out tokens"].map(function (c, i) { return h("th", { scope: "col", "class": i > 6 ? "num" : null }, c); }))),
        finished)));
    function finishedRow(r) {
      return h("tr", { "data-id": r.id, "class": r.outcome !== "ok" ? "bad" : null },
        cell(r.started, when(r.started)), h("td", { "data-value": r.id }, link("#/request/" + encodeURIComponent(r.id), short(r.id))),
        cell(r.request_model, r.request_model || "–", "text"), cell(r.tool, r.tool || "–"), cell(r.kind, r.kind || "–"),
        cell(r.outcome, r.outcome), cell(r.status, r.status == null ? "–" : r.status),
        cell(r.ttft_ms, ms(r.ttft_ms), "num"), cell(r.e2e_ms, ms(r.e2e_ms), "num"),
        cell(r.output_tokens, count(r.output_tokens), "num"));
    }
    // the last ones recorded, until the feed brings newer (the feed has only what finishes from now on)
    get("requests", { limit: 20 }).then(function (d) {
      if (finished.children.length) return;
      d.rows.forEach(function (r) { add(finished, finishedRow(Object.assign({}, r, { started: r.started_at }))); });
    }).catch(function () {});
    live = feed("/_llmtap/live", function (name, data) {
      if (name !== "tick") return;
      var tick = JSON.parse(data);
      while (inflight.firstChild) inflight.removeChild(inflight.firstChild);
      tick.inflight.forEach(function (r) {
        add(inflight, h("tr", { "data-id": r.id },
          cell(r.id, short(r.id)), cell(r.model, r.model || "–", "text"), cell(r.tool, r.tool || "–"),
          cell(r.elapsed_ms, ms(r.elapsed_ms), "num"), cell(r.ttft_ms, ms(r.ttft_ms), "num"),
          cell(r.output_events, count(r.output_events), "num"), cell(r.tokens, count(r.tokens), "num"),
          cell(r.tokens_per_s, r.tokens_per_s == null ? "–" : r.tokens_per_s.toFixed(1), "num")));
      });
      if (!tick.inflight.length) add(inflight, h("tr", null, h("td", { colspan: 8, "class": "muted" }, "nothing in flight")));
      tick.finished.forEach(function (r) {
        var row = finishedRow(r);
        var shown = finished.querySelector('tr[data-id="' + CSS.escape(r.id) + '"]');  // one seeded at load
        if (shown) finished.removeChild(shown);
        finished.insertBefore(row, finished.firstChild);
      });
      while (finished.children.length > FINISHED_KEPT) finished.removeChild(finished.lastChild);
      var lag = tick.loop_lag || {};
      status("live · " + count(tick.requests_seen) + " requests seen · event loop lag p99 " +
             (lag.p99_ms == null ? "–" : lag.p99_ms + " ms") + (tick.dropped ? " · " + tick.dropped + " ticks dropped" : ""));
    }, function () { status("live feed: reconnecting…"); });
  }

  // -- filters (Requests, Sessions, Overview, Compare) --------------------------------------------

  var facetCache = null;
  function facets() {
    if (!facetCache) facetCache = fetchJson("facets", { since: "7d" }).catch(function () { return {}; });
    return facetCache;
  }

  function field(label, name, value, options) {
    var input;
    if (options && options.select) {
      input = h("select", { name: name, id: "f-" + name },
        h("option", { value: "" }, options.blank || "any"),
        options.select.map(function (v) { return h("option", { value: v, selected: v === value }, v); }));
    } else {
      input = h("input", { name: name, id: "f-" + name, value: value || "", placeholder: options && options.placeholder || "",
                           list: options && options.list ? "l-" + name : null, autocomplete: "off" });
    }
    return h("label", { "for": "f-" + name }, label, input,
      options && options.list ? h("datalist", { id: "l-" + name }, options.list.map(function (v) { return h("option", { value: v }); })) : null);
  }

  function filterForm(page, params, names, facetsFound, extra) {
    var f = facetsFound || {};
    var defs = {
      since: ["since", { placeholder: "24h, 7d, ISO" }], until: ["until", { placeholder: "ISO or 1h" }],
      model: ["model", { list: f.request_model }], tool: ["tool", { list: f.tool }], tag: ["tag", { list: f.tag }],
      session: ["session", { list: f.session_id }], kind: ["kind", { select: f.kinds || [] }],
      outcome: ["outcome", { select: f.outcomes || [] }],
    };
    var form = h("form", { "class": "filters", role: "search" },
      names.map(function (n) { return field(defs[n][0], n, params[n], defs[n][1]); }), extra || null,
      h("button", { type: "submit", "class": "primary" }, "Apply"));
    form.addEventListener("submit", function (e) {
      e.preventDefault();
      var next = {};
      new FormData(form).forEach(function (v, k) { if (v) next[k] = v; });
      if (params.sort) { next.sort = params.sort; next.order = params.order; }
      go(page, next);
    });
    return form;
  }

  // -- Requests ----------------------------------------------------------------------------------------

  var LIST = [["started_at", "started (UTC)"], ["id", "id"], ["request_model", "model"], ["tool", "tool"],
              ["kind", "kind"], ["outcome", "outcome"], ["status", "status"], ["ttft_ms", "TTFT"],
              ["tpot_ms", "TPOT"], ["e2e_ms", "E2E"], ["input_tokens", "in"], ["output_tokens", "out"],
              ["cost_usd", "cost"], ["session_id", "session"], ["tag", "tag"], ["error_message", "error"]];
  var NUMERIC = { status: 1, ttft_ms: 1, tpot_ms: 1, e2e_ms: 1, input_tokens: 1, output_tokens: 1, cost_usd: 1 };

  function requestsPage(arg, params) {
    if (!("since" in params)) params.since = "24h";
    var p = Object.assign({ sort: "started_at", order: "desc", offset: 0, limit: 50 }, params);
    show(h("h1", null, "Requests"), h("p", { "class": "muted" }, "Loading…"));
    Promise.all([get("requests", p), facets()]).then(function (got) {
      var data = got[0];
      var head = LIST.map(function (c) {
        if (c[0] === "error_message") return h("th", { scope: "col" }, c[1]);
        var sorted = data.sort === c[0];
        return h("th", { scope: "col", "class": NUMERIC[c[0]] ? "num" : null, "aria-sort": sorted ? (data.order === "asc" ? "ascending" : "descending") : null },
          h("button", { type: "button", "data-sort": c[0], "aria-sort": sorted ? (data.order === "asc" ? "ascending" : "descending") : null,
            title: "sort by " + c[1], onclick: function () {
              go("requests", Object.assign({}, params, { sort: c[0], order: sorted && data.order === "desc" ? "asc" : "desc", offset: 0 }));
            } }, c[1]));
      });
      var rows = data.rows.map(function (r) {
        return h("tr", { "data-id": r.id, "class": r.outcome !== "ok" ? "bad" : null },
          cell(r.started_at, when(r.started_at).slice(5)),
          h("td", { "data-value": r.id }, link("#/request/" + encodeURIComponent(r.id), short(r.id))),
          cell(r.request_model, r.request_model || "–", "text"), cell(r.tool, r.tool || "–"), cell(r.kind, r.kind || "–"),
          cell(r.outcome, r.outcome || "–"), cell(r.status, r.status == null ? "–" : r.status, "num"),
          cell(r.ttft_ms, ms(r.ttft_ms), "num"), cell(r.tpot_ms, ms(r.tpot_ms), "num"), cell(r.e2e_ms, ms(r.e2e_ms), "num"),
          cell(r.input_tokens, count(r.input_tokens), "num"), cell(r.output_tokens, count(r.output_tokens), "num"),
          cell(r.cost_usd, usd(r.cost_usd), "num"),
          h("td", { "data-value": r.session_id || "" }, r.session_id ? h("a", { href: "#/sessions?session=" + encodeURIComponent(r.session_id), title: r.session_id }, shortKey(r.session_id)) : "–"),
          cell(r.tag, r.tag || "–", "text"), cell(r.error_message, r.error_message || "", "error-text"));
      });
      var first = data.total ? data.offset + 1 : 0, last = Math.min(data.total, data.offset + data.rows.length);
      var pager = h("div", { "class": "pager" },
        h("button", { type: "button", id: "prev", disabled: data.offset <= 0, onclick: function () {
          go("requests", Object.assign({}, params, { offset: Math.max(0, data.offset - data.limit) }));
        } }, "← Newer"),
        h("span", { id: "range" }, count(first) + "–" + count(last) + " of " + count(data.total)),
        h("button", { type: "button", id: "next", disabled: last >= data.total, onclick: function () {
          go("requests", Object.assign({}, params, { offset: data.offset + data.limit }));
        } }, "Older →"));
      show(h("h1", null, "Requests"),
        filterForm("requests", params, ["since", "until", "model", "tool", "tag", "session", "kind", "outcome"], got[1]),
        pager, table(head, rows, { label: "Requests", cls: "requests" }), rows.length ? null : h("p", { "class": "muted" }, "No request matches."));
    }).catch(failed);
  }

  // -- One request -------------------------------------------------------------------------------------

  // A bar per item, placed by percent of the whole: the grid's cells (label, track, time) of each.
  function rows(items, whole, cls) {
    return items.map(function (it, i) {
      var bar = h("div", { "class": "bar " + (cls ? cls(it, i) : "part-" + i), title: it.label + ": " + it.text });
      bar.style.left = (100 * it.start / whole) + "%";
      bar.style.width = Math.max(0, 100 * it.size / whole) + "%";
      return [h("div", { "class": "label" }, it.label), h("div", { "class": "track" }, bar),
              h("div", { "class": "ms", "data-value": it.value == null ? "" : String(it.value) }, it.text)];
    });
  }

  function bars(items, whole, cls) { return h("div", { "class": "bars" }, rows(items, whole, cls)); }

  function requestPage(id) {
    show(h("h1", null, "Request " + short(id)), h("p", { "class": "muted" }, "Loading…"));
    get("request/" + encodeURIComponent(id)).then(function (d) {
      var r = d.request;
      var sections = [h("h1", null, "Request " + r.id),
        h("div", { "class": "cols" },
          facts([["started (UTC)", when(r.started_at)], ["method, path", r.method + " " + r.path, "path"],
                 ["kind, dialect", (r.kind || "–") + ", " + (r.dialect || "–")], ["model", r.request_model, "request_model"],
                 ["answered by", r.response_model], ["tool", r.tool, "tool"], ["project", r.project, "project"],
                 ["session", r.kind === "generation" ? h("a", { id: "session-link", href: sessionHref(r) }, r.session_id || "~ (inferred)") : r.session_id, "session"],
                 ["tag", r.tag, "tag"],
                 ["stream", r.stream ? "yes" : "no"]]),
          facts([["status, outcome", (r.status == null ? "–" : r.status) + ", " + r.outcome, "outcome"],
                 ["TTFT", ms(r.ttft_ms), "ttft_ms"], ["TPOT", ms(r.tpot_ms)], ["E2E", ms(r.e2e_ms), "e2e_ms"],
                 ["tokens in / out", count(r.input_tokens) + " / " + count(r.output_tokens)],
                 ["cache read", count(r.cache_read_tokens)], ["cost", usd(r.cost_usd)],
                 ["upstream", r.upstream_host], ["user agent", r.user_agent, "user_agent"],
                 ["credential", r.credential_kind ? r.credential_kind + " · key " + (r.key_fingerprint || "–") : null]]))];
      if (r.error_type || r.error_message || d.diagnosis.length) {
        sections.push(h("h2", null, "Error"),
          h("p", { "class": "error", id: "error-message" }, (r.error_type || "") + (r.error_message ? ": " + r.error_message : "")),
          h("ul", { id: "diagnosis" }, d.diagnosis.map(function (line) { return h("li", null, line); })));
      }
      sections.push(toolSections(r));
      var whole = Math.max(r.e2e_ms || 0, d.waterfall.reduce(function (a, w) { return Math.max(a, w.start_ms + w.ms); }, 0)) || 1;
      sections.push(h("h2", null, "Waterfall"),
        d.waterfall.length ? h("div", { id: "waterfall" }, bars(d.waterfall.map(function (w) {
          return { label: w.part, start: w.start_ms, size: w.ms, value: w.ms, text: ms(w.ms), column: w.column };
        }), whole)) : h("p", { "class": "muted" }, "No breakdown recorded for this request (it failed before, or was answered by llmtap)."),
        h("p", { "class": "muted" }, "From the arrival at the proxy (0) to the end (" + ms(r.e2e_ms) +
          "); the parts are the row's columns (docs/columns.md). Where the upstream stated its time, the wait it" +
          " accounts for is its stated time and the rest is the path (network, gateways)."));
      (d.agent || []).forEach(function (a) {  // the agent's own account of it (docs/sessions.md)
        sections.push(h("p", { "class": "agent-account" }, "The agent's account (" + a.agent + ", " + a.event_name + "): " +
          ms(a.agent_ms) + " against llmtap's " + ms(a.wire_ms) + " (" + a.measure + "): its own client-side time " + ms(a.client_ms) + "."));
      });
      sections.push(h("h2", null, "Chunk timeline"));
      if (d.chunks.length) {
        var gaps = d.chunks.slice(1).map(function (c, i) { return { at: d.chunks[i].offset_ms, gap: c.offset_ms - d.chunks[i].offset_ms, seq: c.seq }; })
          .sort(function (a, b) { return b.gap - a.gap; }).slice(0, 5);
        var chart = h("div", { "class": "chart", id: "chunk-chart" });
        var kinds = chunkKinds(d.chunks);
        sections.push(h("p", { "class": "muted", id: "chunk-kinds" }, count(d.chunks.length) + " events (" + kinds.map(function (k) {
          return k.n + " " + k.kind; }).join(", ") + "); gaps p50 " + ms(r.gap_p50_ms) + ", p99 " +
          ms(r.gap_p99_ms) + ", max " + ms(r.gap_max_ms) + ". Cumulative bytes of each kind of event against its offset."), chart,
          h("div", { "class": "legend", id: "chunk-legend" }, kinds.map(function (k, i) {
            return h("span", { "data-kind": k.kind }, h("i", { style: null, "class": "k" + i }),
              k.kind + ": " + plural(k.n, "event") + ", " + count(k.bytes) + " bytes, last at " + ms(k.last_ms));
          })),
          table(["largest gaps: before event", "at", "gap"], gaps.map(function (g) {
            return h("tr", null, cell(g.seq, g.seq), cell(g.at, ms(g.at), "num"), cell(g.gap, ms(g.gap), "num"));
          }), { label: "Largest gaps" }));
        setTimeout(function () { chunkChart(chart, d.chunks, kinds); }, 0);
      } else {
        sections.push(h("p", { "class": "muted" }, "No chunks recorded (not a stream, or serve --no-chunks)."));
      }
      var limits = Object.keys(d.ratelimits);
      sections.push(h("h2", null, "Rate-limit headroom"), limits.length ? table(["limit", "value"], limits.map(function (k) {
        return h("tr", null, cell(k, k.replace("ratelimit_", "")), cell(d.ratelimits[k], String(d.ratelimits[k]), "text"));
      }), { label: "Rate limits" }) : h("p", { "class": "muted" }, "The upstream stated no limits on this response."));
      sections.push(h("h2", null, "Headers"), h("p", { "class": "muted" },
        "llmtap keeps no header values, only what it read from them, redacted: the tool, user agent, credential kind and the key's fingerprint (above)."));
      if (d.bodies) {
        sections.push(h("h2", null, "Bodies (captured, redacted)"),
          h("h3", null, "Request" + (d.bodies.request_truncated ? " (cut)" : "")), h("pre", { "class": "body", id: "request-body" }, d.bodies.request_body || ""),
          h("h3", null, "Response" + (d.bodies.response_truncated ? " (cut)" : "")), h("pre", { "class": "body", id: "response-body" }, d.bodies.response_body || ""));
      } else {
        sections.push(h("h2", null, "Bodies"), h("p", { "class": "muted" }, "Not captured (serve --capture-bodies)."));
      }
      show(sections);
    }).catch(failed);
  }

  // The events by kind (text, tool_args, reasoning, …: the chunks' event_type), as `llmtap show` counts them.
  function chunkKinds(chunks) {
    var by = {}, out = [];
    chunks.forEach(function (c) {
      var k = c.event_type || "?";
      if (!by[k]) { by[k] = { kind: k, n: 0, bytes: 0, last_ms: null }; out.push(by[k]); }
      by[k].n += 1; by[k].bytes += c.bytes || 0; by[k].last_ms = c.offset_ms;
    });
    return out;
  }

  var KIND_COLORS = ["#0969da", "#8250df", "#bf8700", "#1a7f37", "#cf222e", "#57606a"];

  // One stepped line per kind of event: its cumulative bytes against the offset (null where another
  // kind's event is), so text and tool arguments read apart. The legend is the page's own (real totals).
  function chunkChart(el, chunks, kinds) {
    if (!window.uPlot || !el.isConnected) return;
    var xs = [], totals = {}, ys = kinds.map(function () { return []; });
    chunks.forEach(function (c) {
      var k = c.event_type || "?";
      totals[k] = (totals[k] || 0) + (c.bytes || 0);
      xs.push(c.offset_ms);
      kinds.forEach(function (kind, i) { ys[i].push(kind.kind === k ? totals[k] : null); });
    });
    var plot = new uPlot({
      width: el.clientWidth || 600, height: 240, scales: { x: { time: false } }, legend: { show: false },
      axes: [{ label: "ms from arrival" }, { label: "bytes", size: 60 }],
      series: [{ label: "offset ms" }].concat(kinds.map(function (k, i) {
        return { label: k.kind, stroke: KIND_COLORS[i % KIND_COLORS.length], width: 2, spanGaps: true,
                 paths: uPlot.paths.stepped({ align: 1 }), points: { show: chunks.length < 200, size: 4 } };
      })),
    }, [xs].concat(ys), el);
    plots.push(plot);
  }

  // The tool calls the response asked for (the row's tool_calls: name, when its block ended) and the
  // results the request carried (tool_results), each call's id shown.
  function toolSections(r) {
    var calls = r.tool_calls || [], results = r.tool_results || [];
    return [h("h2", null, "Tools"),
      calls.length ? table(["asked for (the response)", "call id", "block ended"], calls.map(function (c) {
        return h("tr", { "class": "tool-call" }, cell(c.name, c.name || "–", "text"), cell(c.id, c.id || "–"),
          cell(c.ended_ms, c.ended_ms == null ? "cut off" : "+" + ms(c.ended_ms), "num"));
      }), { label: "Tool calls" }) : h("p", { "class": "muted", id: "no-tool-calls" }, "The response asked for no tool."),
      results.length ? table(["results carried (the request)", "answering call id"], results.map(function (c) {
        return h("tr", { "class": "tool-result" }, cell(c.name, c.name || "–", "text"), cell(c.id, c.id || "–"));
      }), { label: "Tool results" }) : h("p", { "class": "muted" }, "The request carried no new tool result.")];
  }

  function sessionHref(r) {
    return "#/session/" + encodeURIComponent(r.session_id || "~") + query({ request: r.id });
  }

  // -- Sessions ------------------------------------------------------------------------------------------

  // A session's time in its parts, each instant once (the totals of `llmtap sessions`): the model
  // (waiting for its first token, generating), tools, you, other.
  var PARTS = [["wait", "wait_s", "model: wait"], ["generating", "generating_s", "model: generating"],
               ["tool", "tool_s", "tools"], ["agent", "agent_s", "the agent's own"], ["you", "you_s", "you"],
               ["other", "other_s", "other"]];

  function legend(extra) {
    return h("div", { "class": "legend" }, PARTS.map(function (p) { return h("span", null, h("i", { "class": p[0] }), p[2]); }), extra || null);
  }

  // One stacked bar: the session's wall on the list's one scale (`longest`), cut into its parts.
  function stack(s, longest) {
    var t = s.totals, bar = h("div", { "class": "stack", role: "img",
      "aria-label": PARTS.map(function (p) { return p[2] + " " + pct(t[p[1]], s.wall_s); }).join(", ") });
    bar.style.width = (100 * s.wall_s / Math.max(longest, 1e-9)) + "%";
    PARTS.forEach(function (p) {
      if (!(t[p[1]] > 0)) return;
      var seg = h("i", { "class": p[0], "data-part": p[0], title: p[2] + ": " + secs(t[p[1]]) + " · " + pct(t[p[1]], s.wall_s) });
      seg.style.width = (100 * t[p[1]] / Math.max(s.wall_s, 1e-9)) + "%";
      add(bar, seg);
    });
    return bar;
  }

  function topTools(t, wall) {
    return Object.keys(t.tools_s).slice(0, 3).map(function (k) { return k + " " + pct(t.tools_s[k], wall); }).join(", ");
  }

  function sessionsPage(arg, params) {
    if (!("since" in params)) params.since = "24h";
    show(h("h1", null, "Sessions"), h("p", { "class": "muted" }, "Loading…"));
    Promise.all([get("sessions", params), facets()]).then(function (got) {
      var data = got[0];
      var longest = data.sessions.reduce(function (m, s) { return Math.max(m, s.wall_s); }, 0);
      var rows = data.sessions.map(function (s) {
        var t = s.totals, tools = topTools(t, s.wall_s);
        var about = [s.tool, s.project, s.first_tool && "first " + s.first_tool].filter(Boolean).join(" · ");
        return h("tr", { "data-session": s.session, "class": s.slow ? "bad" : null, title: s.slow ? "slow: " + s.slow : null },
          h("td", { "data-value": s.session, "class": "who" },
            h("a", { href: "#/session/" + encodeURIComponent(s.session) + query(params), title: s.session },
              (s.inferred ? "~" : "") + shortKey(s.session.replace(/^~/, "")) + (s.slow ? " !" : "")),
            h("small", null, about || "–")),
          cell(s.start, [when(s.start).slice(0, 10), h("br"), when(s.start).slice(11)], "when"),
          cell(s.wall_s, secs(s.wall_s), "num"),
          cell(s.turns, s.turns, "num wide"), cell(s.requests, s.requests, "num wide"),
          h("td", { "class": "bar-cell" }, stack(s, longest), h("small", null, tools ? "tools: " + tools : "")),
          cell(t.model_s, pct(t.model_s, s.wall_s), "num share"), cell(t.tool_s, pct(t.tool_s, s.wall_s), "num share"),
          cell(t.you_s, pct(t.you_s, s.wall_s), "num share"), cell(t.other_s, pct(t.other_s, s.wall_s), "num share"),
          cell(s.output_tokens, count(s.output_tokens), "num wide"), cell(s.cost_usd, usd(s.cost_usd), "num wide"));
      });
      var head = [["session", ""], ["start (UTC)", ""], ["wall", "num"], ["turns", "num wide"], ["reqs", "num wide"],
                  ["time (one scale)", ""], ["model", "num share"], ["tools", "num share"], ["you", "num share"],
                  ["other", "num share"], ["out", "num wide"], ["cost", "num wide"]].map(function (c) {
        return h("th", { scope: "col", "class": c[1] || null }, c[0]);
      });
      show(h("h1", null, "Sessions"), filterForm("sessions", params, ["since", "until", "tool", "model", "session"], got[1]),
        h("p", { "class": "muted" }, count(data.total) + " sessions" + (data.total > data.sessions.length ? ", the newest " + data.sessions.length + " shown" : "") +
          ". Each bar is a session's wall time, all on one scale (the longest fills the column), cut into the shares of it," +
          " each instant counted once (llmtap sessions)."),
        legend(), table(head, rows, { label: "Sessions", cls: "sessions" }),
        rows.length ? null : h("p", { "class": "muted" }, "No session in this window."));
    }).catch(failed);
  }

  // The spans in turns: a turn is the model's and the tools' spans up to the person's next message (a
  // "you" span ends it); a side request (kind 'side') is folded under the turn it started in.
  function turnsOf(s) {
    var turns = [{ spans: [], side: [] }];
    s.spans.forEach(function (sp) {
      var turn = turns[turns.length - 1];
      turn.spans.push(sp);
      if (sp.part === "you") turns.push({ spans: [], side: [] });  // an approval is no new turn
    });
    if (!turns[turns.length - 1].spans.length) turns.pop();
    (s.side || []).forEach(function (r) {
      var at = 0;
      turns.forEach(function (turn, i) { if (turn.spans.length && turn.spans[0].start_s <= r.start_s) at = i; });
      turns[at].side.push(r);
    });
    return turns;
  }

  function spanLabel(sp) { return sp.part === sp.kind ? sp.kind : sp.kind + ": " + sp.part; }

  // Ticks at a round step (1, 2 or 5 of a power of ten) under the Gantt chart, in the track's column.
  function axis(wall) {
    var raw = wall / 6, pow = Math.pow(10, Math.floor(Math.log10(Math.max(raw, 1e-6)))), step = pow;
    [1, 2, 5, 10].some(function (m) { step = m * pow; return step >= raw; });
    var track = h("div", { "class": "axis", id: "time-axis" });
    for (var v = 0; v <= wall + 1e-9; v += step) {
      var tick = h("span", { "data-s": String(v) }, secs(v));
      tick.style.left = (100 * v / wall) + "%";
      add(track, tick);
    }
    return [h("div", { "class": "label muted" }, "from the start"), track, h("div")];
  }

  function sessionPage(key, params) {
    show(h("h1", null, "Session " + key), h("p", { "class": "muted" }, "Loading…"));
    get("session/" + encodeURIComponent(key), params).then(function (s) {
      var t = s.totals;
      var wall = (s.side || []).reduce(function (m, r) { return Math.max(m, r.start_s + (r.e2e_ms || 0) / 1000); },
                                       Math.max(s.wall_s, 1e-9));  // a side request after the last turn is on the scale too
      var gantt = h("div", { id: "gantt", "class": "bars" });
      turnsOf(s).forEach(function (turn, i) {
        add(gantt, h("div", { "class": "turn", "data-turn": i + 1 }, "Turn " + (i + 1) + " · +" + secs(turn.spans[0].start_s)));
        add(gantt, rows(turn.spans.map(function (sp) {
          return { label: spanLabel(sp), start: sp.start_s, size: sp.seconds == null ? s.wall_s - sp.start_s : sp.seconds, value: sp.seconds,
                   text: "+" + secs(sp.start_s) + " · " + secs(sp.seconds), span: sp };
        }), wall, function (it) { return it.span.kind === "model" || it.span.part === "approving" ? it.span.part : it.span.kind + (it.span.open ? " open" : ""); }));
        if (turn.side.length) {
          var inner = h("div", { "class": "bars" }, rows(turn.side.map(function (r) {
            var size = (r.e2e_ms || 0) / 1000;
            return { label: "side: " + (r.model || "model"), start: r.start_s, size: size, value: size, text: "+" + secs(r.start_s) + " · " + secs(size) };
          }), wall, function () { return "side"; }));
          add(gantt, h("details", { "class": "side", "data-turn": i + 1 },
            h("summary", null, plural(turn.side.length, "side request") + " in this turn (beside the agent's turn, not in its time)"), inner));
        }
      });
      add(gantt, axis(wall));
      show(h("h1", null, "Session " + s.session + (s.inferred ? " (inferred)" : "")),
        h("p", { "class": "muted", id: "session-head" }, [s.tool || "unknown tool", s.project, when(s.start) + " UTC", plural(s.requests, "request"),
          plural(s.turns, "turn"), s.models.join(", ") || "no model named", "accounts: " + (s.accounts || "wire")].filter(Boolean).join(" · ")),
        h("div", { "class": "kpis" }, kpi("wall", secs(s.wall_s)), kpi("model", secs(t.model_s) + " · " + pct(t.model_s, s.wall_s)),
          kpi("model: wait (to first token)", secs(t.wait_s)), kpi("model: generating", secs(t.generating_s)),
          kpi("tools", secs(t.tool_s) + " · " + pct(t.tool_s, s.wall_s)), kpi("you", secs(t.you_s) + " · " + pct(t.you_s, s.wall_s)),
          s.accounts === "wire + agent" ? kpi("agent", secs(t.agent_s) + " · approving " + secs(t.approving_s)) : null,
          kpi("other", secs(t.other_s) + " · " + pct(t.other_s, s.wall_s))),
        s.slow ? h("p", { "class": "error" }, "Slow: " + s.slow) : null,
        legend([s.accounts === "wire + agent" ? h("span", null, h("i", { "class": "approving" }), "you: approving") : null,
                s.side && s.side.length ? h("span", null, h("i", { "class": "side" }), "side request") : null]),
        gantt,
        h("h2", null, "Tools"), table(["tool", "time", "share"], Object.keys(t.tools_s).map(function (k) {
          return h("tr", null, cell(k, k, "text"), cell(t.tools_s[k], secs(t.tools_s[k]), "num"), cell(null, pct(t.tools_s[k], s.wall_s), "num"));
        }), { label: "Tools" }),
        h("h2", null, "Spans"), table(["at", "kind", "part", "seconds", "request", "account"], s.spans.map(function (sp) {
          return h("tr", { "class": "span" }, cell(sp.start_s, "+" + secs(sp.start_s), "num"), cell(sp.kind, sp.kind), cell(sp.part, sp.part, "text"),
            cell(sp.seconds, secs(sp.seconds), "num"), h("td", { "data-value": sp.request_id }, sp.request_id ? link("#/request/" + encodeURIComponent(sp.request_id), short(sp.request_id)) : "–"),
            cell(sp.account, sp.account || "wire"));
        }), { label: "Spans" }));
    }).catch(failed);
  }

  // -- Overview -------------------------------------------------------------------------------------------

  function overviewPage(arg, params) {
    if (!("since" in params)) params.since = "24h";
    show(h("h1", null, "Overview"), h("p", { "class": "muted" }, "Loading…"));
    Promise.all([get("overview", params), facets()]).then(function (got) {
      var root = h("div", { id: "overview" });
      show(h("h1", null, "Overview"), filterForm("overview", params, ["since", "until", "model", "tool", "tag"], got[1]),
        h("p", { "class": "muted" }, "Generations only (no token counts, probes, model lists: Requests and llmtap errors count every request);" +
          " the page of llmtap report --html, drawn by the same code."), root);
      window.llmtapOverview(root, got[0]).forEach(function (p) { plots.push(p.plot); });
    }).catch(failed);
  }

  // -- Compare --------------------------------------------------------------------------------------------

  function comparePage(arg, params) {
    facets().then(function (f) {
      var by = params.by || "model";
      var column = { model: "request_model", tool: "tool", tag: "tag" }[by];
      var values = column ? f[column] || [] : [];
      var form = filterForm("compare", params, ["since"], f, [
        h("label", { "for": "f-by" }, "by", h("select", { name: "by", id: "f-by" },
          (f.compare_by || ["model"]).map(function (v) { return h("option", { value: v, selected: v === by }, v); }))),
        field("baseline (a)", "a", params.a, { list: values }), field("against (b)", "b", params.b, { list: values })]);
      var out = h("div", { id: "compare-out" });
      show(h("h1", null, "Compare"), h("p", { "class": "muted" }, "Two channels (models, tools, routes, …): llmtap compare's answer, with confidence."), form, out);
      if (!params.a || !params.b) { add(out, h("p", { "class": "muted" }, "Pick a baseline and a second side, then Apply.")); return; }
      add(out, h("p", { "class": "muted" }, "Comparing…"));
      get("compare", params).then(function (c) {
        while (out.firstChild) out.removeChild(out.firstChild);
        var metrics = ["ttft", "tpot", "e2e"];
        add(out, [h("h2", null, "Sides"), table(["side", "requests"].concat(metrics.map(function (m) { return m.toUpperCase() + " p50"; }),
          metrics.map(function (m) { return m.toUpperCase() + " p95"; })), c.groups.map(function (g) {
          return h("tr", null, cell(g.label, g.label, "text"), cell(g.requests, count(g.requests), "num"),
            metrics.map(function (m) { return cell(g[m] && g[m].p50_ms, ms(g[m] && g[m].p50_ms), "num"); }),
            metrics.map(function (m) { return cell(g[m] && g[m].p95_ms, ms(g[m] && g[m].p95_ms), "num"); }));
        }), { label: "Sides" }),
        h("h2", null, "Differences"), table(["metric", "side", "median diff", "95% interval", "verdict", "note"], c.differences.map(function (d) {
          return h("tr", null, cell(d.metric, d.metric), cell(d.group, d.group, "text"), cell(d.median_diff_ms, ms(d.median_diff_ms), "num"),
            cell(null, d.ci_low_ms == null ? "–" : ms(d.ci_low_ms) + " … " + ms(d.ci_high_ms), "num"),
            cell(d.verdict, d.verdict || "–", "verdict text"), cell(d.note, d.note || "", "text"));
        }), { label: "Differences" })]);
      }).catch(function (err) {
        while (out.firstChild) out.removeChild(out.firstChild);
        add(out, h("p", { "class": "error", role: "alert" }, String(err.message || err)));
      });
    });
  }

  function start() {
    login().then(function () {
      if (sessionStorage.getItem(SESSION)) { render(); return; }
      loggedOut();
    }, function (err) { loggedOut("That login link was used already or is too old: " + String(err && err.message || err)); });
  }
  window.addEventListener("hashchange", function () {
    if (location.hash.slice(0, 7) === "#login=") { start(); return; }
    render();
    main.focus();
  });
  start();
})();
