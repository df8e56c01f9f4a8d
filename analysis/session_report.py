"""`llmtap sessions` and `llmtap session ID`: the sessions of `timeline.py` as text and JSON.

The list shows each session's wall time and the shares of it that went to the model (waiting for
the first token / generating), the tools (the three that took longest) and you. One session is a
text Gantt chart, a line per span on one time scale, then the totals ("/usage, but for time").
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from analysis.formatting import dumps, fmt_count, fmt_usd, layout, truncate
from analysis.report import fmt_wall
from analysis.timeline import Session, Span, Totals

WIDTH = 80
GANTT_WIDTH = 36
TOP_TOOLS = 3
PART_NAMES = {"you": "", "agent": "", "request": "not at llmtap"}  # how a span's part reads in the chart (tools: their names; `wait` as the JSON and the UI name it)


def fmt_s(seconds: float | None) -> str:
    """0.123 -> '123ms', 42.5 -> '42.5s', 754 -> '12m34s'."""
    if seconds is not None and seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    return fmt_wall(seconds)


def when(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def share(part: float, whole: float) -> str:
    return f"{100 * part / whole:.0f}%" if whole > 0 else "-"


def top_tools(totals: Totals, n: int = TOP_TOOLS) -> str:
    tools = list(totals.tools_s.items())[:n]
    return ", ".join(f"{name} {share(s, totals.wall_s)}" for name, s in tools) or "-"


def session_json(s: Session, spans: bool = False) -> dict[str, Any]:
    t = s.totals
    out: dict[str, Any] = {
        "session": s.key, "session_id": s.session_id, "inferred": s.inferred, "tool": s.tool,
        "project": s.project, "first_tool": s.first_tool,
        "start": datetime.fromtimestamp(s.start_s, timezone.utc).isoformat(), "wall_s": round(t.wall_s, 3),
        "turns": s.turns, "requests": s.requests, "models": s.models,
        "totals": {"model_s": round(t.model_s, 3), "wait_s": round(t.wait_s, 3), "generating_s": round(t.generating_s, 3),
                   "tool_s": round(t.tool_s, 3), "tools_s": {k: round(v, 3) for k, v in t.tools_s.items()},
                   "you_s": round(t.you_s, 3), "approving_s": round(t.approving_s, 3),
                   "agent_s": round(t.agent_s, 3), "other_s": round(t.other_s, 3)},
        "accounts": s.accounts, "client_ms": {k: round(v, 1) for k, v in s.client_ms.items()},
        "input_tokens": s.input_tokens, "output_tokens": s.output_tokens, "cost_usd": s.cost_usd, "slow": s.slow,
    }
    if spans:
        out["spans"] = [span_json(sp, s.start_s, s.request_client_ms) for sp in s.spans]
    return out


def span_json(span: Span, origin: float, client_ms: dict[str, float] | None = None) -> dict[str, Any]:
    """A span; `account`: the account it comes from (the agent's: its approvals, its own time, a request
    that never reached llmtap); a model span's `client_ms`: the agent's own time around the request's."""
    out = {"kind": span.kind, "part": span.part, "start_s": round(span.start_s - origin, 6),
           "seconds": None if span.seconds is None else round(span.seconds, 6), "open": span.end_s is None,
           "request_id": span.request_id, "model": span.model, "calls": list(span.calls),
           "account": "agent" if span.kind == "agent" or span.part == "approving" else "wire"}
    if span.kind == "model" and client_ms and span.request_id in client_ms:
        out["client_ms"] = round(client_ms[span.request_id], 1)
    return out


def render_sessions(found: list[Session], fmt: str, total: int | None = None) -> str:
    """The sessions (`total`: how many the window has, when `found` are the newest of them)."""
    if fmt == "json":
        return dumps([session_json(s) for s in found])
    if not found:
        return ("no sessions in this window (sessions are made of generations: see `llmtap report --by session`;"
                " --since all for every one)\n")
    first, second = [], []
    agent = any(s.accounts != "wire" for s in found)  # the agent's own time: a column where any has it
    for s in found:
        t = s.totals
        key = (("~" if s.inferred else "") + truncate(s.key.lstrip("~"), 14) + (" !" if s.slow else "")
               + (" +" if s.accounts != "wire" else ""))
        first.append([key, when(s.start_s)[:16], s.tool or "-", fmt_s(t.wall_s), str(s.turns), str(s.requests),
                      fmt_count(s.output_tokens), fmt_usd(s.cost_usd)])
        second.append([key, share(t.model_s, t.wall_s), share(t.wait_s, t.wall_s), share(t.generating_s, t.wall_s),
                       top_tools(t), *([share(t.agent_s, t.wall_s)] if agent else []), share(t.you_s, t.wall_s),
                       share(t.other_s, t.wall_s)])
    text = layout(["session", "start (UTC)", "tool", "wall", "turns", "reqs", "out", "cost"], first,
                  [False, False, False, True, True, True, True, True], limit=WIDTH, shrinkable=[2])
    names = ["session", "model", "wait", "gen", "tools (top 3)", *(["agent"] if agent else []), "you", "other"]
    text += "\n" + layout(names, second, [False, True, True, True, False, *[True] * (len(names) - 5)],
                          groups=["", *["share of wall time"] * (len(names) - 1)], limit=WIDTH, shrinkable=[4])
    notes = []
    if any(s.inferred for s in found):
        notes.append("~ inferred: the tool sends no session id, so its requests are grouped by tool and key.")
    if agent:
        notes.append("+ wire + agent: built from the agent's own account too (its approvals, runs and own time);"
                     " the rest from the wire alone.")
    for s in found:
        if s.slow:
            notes.append(f"! {truncate(s.key, 14)} is slow: {s.slow}.")
    notes.append("Each instant once: the model (wait: for its first token; gen: generating), tools, you, other.")
    if total is not None and total > len(found):
        notes.append(f"The newest {len(found)} of {total:,} sessions in this window: --limit N for more,"
                     " --since for another window (all: every one).")
    return text + "\n".join(notes) + "\n"


def render_session(s: Session, fmt: str) -> str:
    if fmt == "json":
        return dumps(session_json(s, spans=True))
    t = s.totals
    wall = max(t.wall_s, 1e-9)
    head = (f"session {s.key}{' (inferred)' if s.inferred else ''}, {s.tool or 'unknown tool'}, "
            f"{when(s.start_s)} UTC, wall {fmt_s(t.wall_s)}, {_count(s.requests, 'request')}, {_count(s.turns, 'turn')}; "
            f"{', '.join(s.models) or 'no model named'}; accounts: {s.accounts}")
    lines = [head, ""]
    for span in s.spans:
        lines.append(_gantt_line(span, s.start_s, wall, s.end_s))
    lines += ["", *_totals_lines(t, s)]
    if s.slow:
        lines.append(f"Slow: {s.slow}.")
    return "\n".join(lines) + "\n"


def _gantt_line(span: Span, origin: float, wall: float, end: float) -> str:
    start = span.start_s - origin
    stop = (span.end_s if span.end_s is not None else end) - origin
    a = min(GANTT_WIDTH - 1, int(start / wall * GANTT_WIDTH))
    b = max(a + 1, min(GANTT_WIDTH, round(stop / wall * GANTT_WIDTH)))
    bar = " " * a + ("░" if span.end_s is None else "█") * (b - a) + " " * (GANTT_WIDTH - b)
    seconds = "open" if span.end_s is None else fmt_s(span.seconds)
    return f"{'+' + fmt_s(start):>8}  {span.kind:<5}  {truncate(PART_NAMES.get(span.part, span.part), 16):<16}  |{bar}|  {seconds:>6}"


CLIENT_NAMES = {"e2e": "requests (its duration less E2E)", "headers": "requests (its duration less until headers)",
                "ttft": "first tokens (its turn_ttft less TTFT)"}


def _totals_lines(t: Totals, s: Session) -> list[str]:
    lines = [f"Time, wall {fmt_s(t.wall_s)}, each instant counted once:",
             f"  model   {fmt_s(t.model_s):>7}  {share(t.model_s, t.wall_s):>4}   wait {fmt_s(t.wait_s)}"
             f" ({share(t.wait_s, t.wall_s)}), generating {fmt_s(t.generating_s)} ({share(t.generating_s, t.wall_s)})",
             f"  tools   {fmt_s(t.tool_s):>7}  {share(t.tool_s, t.wall_s):>4}   "
             + (", ".join(f"{truncate(n, 24)} {fmt_s(v)}" for n, v in t.tools_s.items()) or "-"),
             f"  agent   {fmt_s(t.agent_s):>7}  {share(t.agent_s, t.wall_s):>4}   (its own time around the tools' runs)"
             if s.accounts != "wire" else "",
             f"  you     {fmt_s(t.you_s):>7}  {share(t.you_s, t.wall_s):>4}" + (
                 f"   approving {fmt_s(t.approving_s)}, reading or typing {fmt_s(t.you_s - t.approving_s)}"
                 if s.accounts != "wire" else ""),
             f"  other   {fmt_s(t.other_s):>7}  {share(t.other_s, t.wall_s):>4}   (none of the above: overlaps ended, gaps)"]
    lines = [line for line in lines if line]
    if s.client_ms:
        lines.append("The agent's own client-side time around llmtap's: " + ", ".join(
            f"{CLIENT_NAMES[k]} {v:+,.0f}ms" for k, v in s.client_ms.items())
            + (f"; most, {fmt_s(max(s.request_client_ms.values()) / 1000)} on one request" if s.request_client_ms else ""))
    if any(sp.part == "request" for sp in s.spans):
        lines.append("not at llmtap: a request the agent timed that never reached llmtap (given up, an error before"
                     " connecting), as the agent saw it.")
    runs = sorted((sp for sp in s.spans if sp.kind == "tool" and sp.end_s is not None), key=lambda sp: -(sp.seconds or 0))
    if runs:
        lines.append("Longest tool runs: " + ", ".join(
            f"{truncate(sp.part, 24)} {fmt_s(sp.seconds)} (at +{fmt_s(sp.start_s - s.start_s)})" for sp in runs[:5]))
    opened = [sp for sp in s.spans if sp.end_s is None]
    if opened:
        lines.append("Open: " + ", ".join(f"{truncate(sp.part, 24)} since +{fmt_s(sp.start_s - s.start_s)}"
                                          " (its result never came)" for sp in opened))
    if s.input_tokens is not None or s.output_tokens is not None:
        lines.append(f"Tokens: {fmt_count(s.input_tokens)} in, {fmt_count(s.output_tokens)} out; cost {fmt_usd(s.cost_usd)}")
    return lines


def render_tool_runs(groups: list[dict[str, Any]], fmt: str, week: bool = False) -> str:
    """`llmtap report --by tool_name`: each tool's run time across sessions (timeline.tool_names); `week`:
    over the last week, the window when none is given."""
    if fmt == "json":
        return dumps({"by": "tool_name", "groups": [
            {k: round(v, 3) if isinstance(v, float) else v for k, v in g.items()} for g in groups]})
    if not groups:
        return ("no tool runs in this window (tools are seen where a response asks for one"
                + ("; the last 7 days: --since all for every one" if week else "") + ")\n")
    points = ("p50_s", "p95_s", "p99_s", "max_s", "total_s")
    rows = [[g["tool_name"] or "?", str(g["runs"]), str(g["open"]), str(g["in_groups"]), *(fmt_s(g[p]) for p in points)]
            for g in groups]
    text = layout(["tool", "runs", "open", "grouped", "p50", "p95", "p99", "max", "total"], rows,
                  [False, True, True, True, True, True, True, True, True],
                  groups=["", "", "", "", "run time", "run time", "run time", "run time", ""], limit=WIDTH,
                  shrinkable=[0])
    return text + "\n".join([
        "A call's run: from its block's end in the response to the request that brought its result; open: none came.",
        "Calls asked for together (Bash+Read) count once, as their group; grouped: a tool's calls in groups",
        "(the results come back together: the wire does not say when each call ended).",
        *(["The last 7 days: --since for another window (all: every one)."] if week else [])]) + "\n"


# The HTML report's sessions panel: each part's colour (the TTFT breakdown's palette, analysis/breakdown.py).
PART_COLORS = (("wait", "first-token wait", "#4e79a7"), ("generating", "generating", "#59a14f"),
               ("tool", "tools", "#f28e2b"), ("agent", "the agent's own", "#9c755f"), ("you", "you", "#b07aa1"),
               ("other", "other", "#d0d4d8"))
HTML_SESSIONS = 12


def html_panel(found: list[Session]) -> str:
    """The sessions as a panel of the HTML report, HTML and CSS only: a bar per session (the latest
    first) of where its wall time went, then the latest session's timeline, a row per span."""
    if not found:
        return ""
    import html

    e = html.escape
    legend = "".join(f'<span><span class="swatch" style="background:{c}"></span>{e(label)}</span> '
                     for _, label, c in PART_COLORS)
    rows = []
    for s in list(reversed(found))[:HTML_SESSIONS]:
        t = s.totals
        parts = {"wait": t.wait_s, "generating": t.generating_s, "tool": t.tool_s, "agent": t.agent_s, "you": t.you_s,
                 "other": t.other_s}
        wall = t.wall_s or 1.0
        segments = "".join(f'<span class="seg" style="width:{100 * parts[k] / wall:.3f}%;background:{c}" '
                           f'title="{e(label)}: {e(fmt_s(parts[k]))}"></span>' for k, label, c in PART_COLORS)
        rows.append(f'<tr><th scope="row">{e(truncate(s.key, 20))}</th><td>{e(s.tool or "-")}</td>'
                    f'<td class="n">{e(fmt_s(t.wall_s))}</td><td class="n">{s.requests}</td>'
                    f'<td class="bar"><div class="stack">{segments}</div></td><td>{e(top_tools(t))}</td></tr>')
    return ('<section class="panel sessions"><h2>Sessions: where the time went</h2>'
            '<p class="note">Each session\'s wall time, each instant counted once: the model (waiting for the first '
            'token, generating), the tools it called (from the response that asked to the request that brought '
            'the result), you (a finished answer to your next prompt), and other (`llmtap sessions`).</p>'
            f'<p class="legend">{legend}</p>'
            '<div class="scroll"><table class="num sessions"><thead><tr><th>Session</th><th>Tool</th><th>Wall</th>'
            '<th>Requests</th><th>Where the time went</th><th>Top tools</th></tr></thead><tbody>'
            + "".join(rows) + "</tbody></table></div>" + _html_timeline(found[-1], e)
            + "<style>.sessions td.bar{width:50%;min-width:12rem}.sessions .stack{display:flex;height:1.1rem}"
            ".sessions .seg{display:block;height:100%}.sessions .legend span{margin-right:.8rem}"
            ".gantt{position:relative;height:1rem;background:#f4f5f6}.gantt .seg{position:absolute;height:100%}"
            ".gantt .open{opacity:.45}</style></section>")


def _html_timeline(s: Session, e: Any) -> str:
    colors = {k: c for k, _, c in PART_COLORS}
    wall = max(s.totals.wall_s, 1e-9)
    rows = []
    for span in s.spans:
        end = span.end_s if span.end_s is not None else s.end_s
        left, width = 100 * (span.start_s - s.start_s) / wall, max(0.2, 100 * (end - span.start_s) / wall)
        color = colors.get(span.kind if span.kind in ("tool", "agent", "you") else span.part, colors["other"])
        label = span.part if span.kind != "model" else f"{span.part} {span.model or ''}".strip()
        seconds = "open" if span.end_s is None else fmt_s(span.seconds)
        rows.append(f'<tr><td class="n">+{e(fmt_s(span.start_s - s.start_s))}</td><td>{e(span.kind)}</td>'
                    f'<td>{e(truncate(label, 32))}</td><td class="bar"><div class="gantt"><span class="seg'
                    f'{" open" if span.end_s is None else ""}" style="left:{left:.3f}%;width:{width:.3f}%;'
                    f'background:{color}"></span></div></td><td class="n">{e(seconds)}</td></tr>')
    return (f'<h3>The latest session, {e(truncate(s.key, 40))}</h3><div class="scroll"><table class="num sessions">'
            "<thead><tr><th>At</th><th>Part</th><th>What</th><th>Timeline</th><th>Took</th></tr></thead><tbody>"
            + "".join(rows) + "</tbody></table></div>")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")
