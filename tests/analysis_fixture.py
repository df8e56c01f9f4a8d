"""A small, hand-designed llmtap database for the analysis tests.

`build_fixture_db(path)` writes 31 requests over three UTC days
(2026-11-28 .. 2026-11-30) and the chunks of their streams. Every value is
fixed, so tests can assert exact output. What is in it:

- tools claude-code, codex, cline, openai-python, curl (and one row with no
  tool); routes "/", "/openai", "/local"; tags "refactor", "bench" and none;
- streamed and non-streamed successes, cache reads, a one-token stream (no
  TPOT), a request with no model (GET /v1/models);
- a row of every outcome: http_error, upstream_unreachable (502),
  upstream_timeout (504), client_disconnected, stream_truncated,
  stream_error (an `overloaded_error` event mid-stream), proxy_error (502),
  with the statuses and error types the proxy records;
- HTTP errors: 401 twice (a stale key and no key), 403, 404 on `/v1/v1/`,
  404 on a path without `/v1`, 404 on an unknown model, 429 with
  retry-after, 500, 529;
- an ok stream with empty_choices_chunks = 2.

Derived timing columns follow the meter: tpot = (last - ttft) / (out - 1),
output_tokens_per_s = out * 1000 / e2e, gap stats from the chunk offsets.
"""

from __future__ import annotations

import hashlib
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import duckdb

from proxy.common.schema import CHUNK_COLUMN_NAMES, REQUEST_COLUMN_NAMES, create_tables_sql

DAY0 = datetime(2026, 11, 28, tzinfo=timezone.utc)

TOOLS: dict[str | None, dict[str, Any]] = {
    "claude-code": {"route": "/", "upstream_host": "api.anthropic.com", "dialect": "anthropic",
                    "path": "/v1/messages", "user_agent": "claude-cli/2.1.197 (external, sdk-cli)",
                    "key_fingerprint": "k:7f3a9c1e5b20", "max_tokens": 32000, "message_count": 12,
                    "request_bytes": 76120},
    "codex": {"route": "/openai", "upstream_host": "api.openai.com", "dialect": "openai_responses",
              "path": "/openai/v1/responses", "user_agent": "codex_exec/0.171.0 (Debian 12.0.0; x86_64)",
              "key_fingerprint": "k:2b8d4e60aa17", "message_count": 6, "request_bytes": 40210},
    "cline": {"route": "/local", "upstream_host": "llm.internal", "dialect": "openai_chat",
              "path": "/local/v1/chat/completions", "user_agent": "Cline/3.0.65 ai-sdk/openai-compatible",
              "key_fingerprint": "k:c0ffee12d00d", "message_count": 9, "request_bytes": 20480},
    "openai-python": {"route": "/openai", "upstream_host": "api.openai.com", "dialect": "openai_chat",
                      "path": "/openai/v1/chat/completions", "user_agent": "OpenAI/Python 1.99.0",
                      "key_fingerprint": "k:2b8d4e60aa17", "max_tokens": 512, "message_count": 2,
                      "request_bytes": 640},
    "curl": {"route": "/", "upstream_host": "api.anthropic.com", "dialect": "anthropic",
             "path": "/v1/messages", "user_agent": "curl/8.5.0",
             "key_fingerprint": "k:7f3a9c1e5b20", "max_tokens": 64, "message_count": 1,
             "request_bytes": 180},
    None: {"route": "/", "upstream_host": "api.anthropic.com", "dialect": "anthropic",
           "path": "/v1/messages", "user_agent": None,
           "key_fingerprint": "k:7f3a9c1e5b20", "message_count": 1, "request_bytes": 210},
}

RESPONSE_MODEL = {
    "claude-sonnet-4-5": "claude-sonnet-4-5-20250929",
    "claude-haiku-4-5": "claude-haiku-4-5-20251001",
    "gpt-5": "gpt-5-2025-08-07",
    "gpt-4.1-mini": "gpt-4.1-mini-2025-04-14",
    "qwen3-coder-30b": "qwen3-coder-30b",
}

SONNET, HAIKU, GPT5, MINI, QWEN = RESPONSE_MODEL


def _uuid(text: str) -> str:
    return str(uuid.UUID(hashlib.md5(text.encode()).hexdigest()))


S = {name: _uuid(f"session-{name}") for name in ("s1", "s2", "s3", "s4", "s5", "s6", "s7")}


def _at(day: int, hms: str) -> datetime:
    h, m, s = (int(x) for x in hms.split(":"))
    return DAY0 + timedelta(days=day, hours=h, minutes=m, seconds=s)


# n, day, time, tool, model, kind, extra. Kinds: "stream" (ttft, e2e, out,
# in, cache_read, events), "plain" (non-streamed: e2e, out, in), "http"
# (status, error_type, error_message, e2e), "fail" (outcome, e2e, ...).
SPECS: tuple[tuple[int, int, str, str | None, str | None, str, dict[str, Any]], ...] = (
    (1, 0, "09:02:11", "claude-code", SONNET, "stream", dict(ttft=820, e2e=6400, out=250, inp=18000, cache=15000, events=40, tag="refactor", session="s1")),
    (2, 0, "09:05:40", "claude-code", SONNET, "stream", dict(ttft=950, e2e=8100, out=320, inp=21000, cache=18000, events=48, tag="refactor", session="s1")),
    (3, 0, "09:07:03", "claude-code", HAIKU, "plain", dict(e2e=1200, out=40, inp=3000, tag="refactor", session="s1")),
    (4, 0, "10:15:00", "claude-code", SONNET, "http", dict(status=401, error_type="authentication_error", error_message="invalid x-api-key", e2e=180, key="k:9d41b7aa03c2", session="s2")),
    (5, 0, "10:16:30", "claude-code", SONNET, "http", dict(status=401, error_type="authentication_error", error_message="x-api-key header is required", e2e=150, key=None, session="s2")),
    (6, 0, "11:00:00", "claude-code", SONNET, "http", dict(status=404, error_type="not_found_error", error_message="Not Found", e2e=210, path="/v1/v1/messages", session="s3")),
    (7, 0, "14:20:00", "codex", GPT5, "stream", dict(ttft=2400, e2e=14500, out=900, inp=40000, cache=32000, events=45, reasoning=400, session="s4")),
    (8, 0, "14:25:00", "openai-python", MINI, "plain", dict(e2e=1900, out=120, inp=800, tag="bench")),
    (9, 0, "14:26:00", "cline", QWEN, "http", dict(status=404, error_type=None, error_message="404 page not found", e2e=40, path="/local/chat/completions")),
    (10, 0, "16:45:00", "codex", "gpt-5o", "http", dict(status=404, error_type="invalid_request_error", error_message="The model `gpt-5o` does not exist or you do not have access to it.", e2e=320, session="s4")),
    (11, 1, "08:30:00", "claude-code", SONNET, "stream", dict(ttft=700, e2e=5200, out=180, inp=25000, cache=24000, events=30, tag="refactor", session="s5")),
    (12, 1, "08:31:00", "claude-code", SONNET, "http", dict(status=429, error_type="rate_limit_error", error_message="Number of request tokens has exceeded your per-minute rate limit", e2e=240, retry_after="30", tag="refactor", session="s5")),
    (13, 1, "08:31:40", "claude-code", SONNET, "stream", dict(ttft=900, e2e=2400, out=60, inp=25500, cache=24000, events=10, outcome="stream_error", error_type="overloaded_error", error_message="Overloaded", tag="refactor", session="s5")),
    (14, 1, "09:10:00", "codex", GPT5, "http", dict(status=500, error_type="server_error", error_message="The server had an error while processing your request. Sorry about that!", e2e=2100, session="s4")),
    (15, 1, "09:40:00", "claude-code", SONNET, "http", dict(status=529, error_type="overloaded_error", error_message="Overloaded", e2e=900, session="s5")),
    (16, 1, "10:05:00", "cline", QWEN, "fail", dict(outcome="upstream_unreachable", status=502, e2e=35, error_type="upstream_unreachable", error_message="cannot reach upstream llm.internal: Name or service not known")),
    (17, 1, "10:30:00", "codex", GPT5, "fail", dict(outcome="upstream_timeout", status=504, e2e=600000, error_type="upstream_timeout", error_message="upstream api.openai.com did not answer in time (timed out)", session="s4")),
    (18, 1, "13:00:00", "claude-code", SONNET, "stream", dict(ttft=1100, e2e=45000, out=410, inp=None, cache=None, events=60, outcome="client_disconnected", session="s5")),
    (19, 1, "13:30:00", "cline", QWEN, "stream", dict(ttft=600, e2e=9000, out=300, inp=None, cache=None, events=80, outcome="stream_truncated")),
    (20, 1, "15:00:00", "cline", QWEN, "stream", dict(ttft=450, e2e=3000, out=150, inp=6000, cache=None, events=25, empty=2)),
    (21, 1, "15:05:00", "cline", QWEN, "stream", dict(ttft=380, e2e=2600, out=120, inp=6500, cache=None, events=20)),
    (22, 1, "15:06:00", "openai-python", MINI, "fail", dict(outcome="proxy_error", status=502, e2e=12, error_type="proxy_error", error_message="KeyError: 'content-type'", tag="bench")),
    (23, 2, "09:00:00", "claude-code", SONNET, "stream", dict(ttft=1500, e2e=22000, out=1200, inp=60000, cache=55000, events=50, tag="refactor", session="s6")),
    (24, 2, "09:02:00", "claude-code", SONNET, "stream", dict(ttft=640, e2e=4100, out=140, inp=61000, cache=60000, events=22, tag="refactor", session="s6")),
    (25, 2, "09:03:00", "claude-code", SONNET, "stream", dict(ttft=3200, e2e=3210, out=1, inp=61500, cache=61000, events=1, tag="refactor", session="s6")),
    (26, 2, "09:04:00", "claude-code", HAIKU, "plain", dict(e2e=900, out=30, inp=2500, session="s6")),
    (27, 2, "11:00:00", "codex", GPT5, "stream", dict(ttft=1800, e2e=9800, out=600, inp=42000, cache=38000, events=35, reasoning=250, session="s7")),
    (28, 2, "11:05:00", "codex", GPT5, "stream", dict(ttft=2100, e2e=12500, out=700, inp=43000, cache=40000, events=38, reasoning=300, session="s7")),
    (29, 2, "12:00:00", "claude-code", "claude-opus-4-1", "http", dict(status=403, error_type="permission_error", error_message="Your API key does not have permission to use the specified model.", e2e=200, session="s6")),
    (30, 2, "17:40:00", "curl", HAIKU, "plain", dict(e2e=700, out=20, inp=50)),
    (31, 2, "17:41:00", None, None, "models", dict(e2e=95)),
)


def request_id(n: int) -> str:
    return _uuid(f"request-{n}")


def _base(n: int, day: int, hms: str, tool: str | None, model: str | None, x: dict[str, Any]) -> dict[str, Any]:
    t = TOOLS[tool]
    row: dict[str, Any] = dict.fromkeys(REQUEST_COLUMN_NAMES)
    row.update(
        id=request_id(n), started_at=_at(day, hms), route=t["route"], upstream_host=t["upstream_host"],
        method="POST", path=x.get("path", t["path"]), dialect=t["dialect"], tool=tool,
        user_agent=t["user_agent"], tag=x.get("tag"),
        key_fingerprint=x["key"] if "key" in x else t["key_fingerprint"],
        session_id=S.get(x.get("session", "")), request_model=model, stream=False,
        max_tokens=t.get("max_tokens"), message_count=t["message_count"],
        request_bytes=t["request_bytes"], empty_choices_chunks=0, proxy_overhead_ms=0.4,
        output_events=0,
    )
    return row


def _gaps(total: float, count: int) -> list[float]:
    """`count` uneven but fixed gaps summing to `total`."""
    weights = [1 + (i * 7 % 5) / 4 for i in range(count)]
    scale = total / sum(weights)
    return [w * scale for w in weights]


def _quantile(values: list[float], q: float) -> float:
    s = sorted(values)
    pos = (len(s) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _stream(row: dict[str, Any], x: dict[str, Any]) -> list[float]:
    ttft, e2e, out, events = x["ttft"], x["e2e"], x["out"], x["events"]
    last = e2e - 15 if events > 1 else ttft
    gaps = _gaps(last - ttft, events - 1) if events > 1 else []
    offsets = [float(ttft)]
    for g in gaps:
        offsets.append(offsets[-1] + g)
    outcome = x.get("outcome", "ok")
    row.update(
        stream=True, status=200, outcome=outcome, response_model=RESPONSE_MODEL[row["request_model"]],
        finish_reason=None if outcome != "ok" else ("end_turn" if row["dialect"] == "anthropic" else "stop"),
        error_type=x.get("error_type"), error_message=x.get("error_message"),
        response_bytes=events * 160 + 900, empty_choices_chunks=x.get("empty", 0),
        upstream_headers_ms=round(ttft * 0.5, 1), first_byte_ms=round(ttft * 0.55, 1),
        ttft_ms=float(ttft), first_text_ms=float(ttft) + (800 if x.get("reasoning") else 0),
        last_token_ms=round(last, 3), e2e_ms=float(e2e), output_events=events,
        tpot_ms=(last - ttft) / (out - 1) if out > 1 and events > 1 else None,
        gap_p50_ms=round(_quantile(gaps, 0.5), 3) if gaps else None,
        gap_p99_ms=round(_quantile(gaps, 0.99), 3) if gaps else None,
        gap_max_ms=round(max(gaps), 3) if gaps else None,
        output_tokens_per_s=out * 1000 / e2e, input_tokens=x["inp"], output_tokens=out,
        cache_read_tokens=x["cache"], cache_creation_tokens=0 if x["cache"] is not None else None,
        reasoning_tokens=x.get("reasoning"), tokens_source="usage" if outcome == "ok" else "estimated",
    )
    return offsets


def _plain(row: dict[str, Any], x: dict[str, Any]) -> None:
    e2e = x["e2e"]
    row.update(
        status=200, outcome="ok", response_model=RESPONSE_MODEL[row["request_model"]],
        finish_reason="end_turn" if row["dialect"] == "anthropic" else "stop",
        response_bytes=x["out"] * 5 + 300, upstream_headers_ms=e2e - 20.0, first_byte_ms=e2e - 18.0,
        e2e_ms=float(e2e), output_tokens_per_s=x["out"] * 1000 / e2e, input_tokens=x["inp"],
        output_tokens=x["out"], cache_read_tokens=0, cache_creation_tokens=0, tokens_source="usage",
    )


def _http(row: dict[str, Any], x: dict[str, Any]) -> None:
    e2e = x["e2e"]
    row.update(
        status=x["status"], outcome="http_error", error_type=x["error_type"],
        error_message=x["error_message"], retry_after=x.get("retry_after"),
        response_bytes=len(x["error_message"]) + 60, upstream_headers_ms=e2e - 10.0,
        first_byte_ms=e2e - 8.0, e2e_ms=float(e2e),
    )


def _fail(row: dict[str, Any], x: dict[str, Any]) -> None:
    row.update(
        status=x.get("status"), outcome=x["outcome"], error_type=x["error_type"],
        error_message=x["error_message"], e2e_ms=float(x["e2e"]),
    )


def _models(row: dict[str, Any], x: dict[str, Any]) -> None:
    row.update(
        method="GET", path="/v1/models", status=200, outcome="ok", response_bytes=2300,
        upstream_headers_ms=80.0, first_byte_ms=82.0, e2e_ms=float(x["e2e"]), stream=None,
        message_count=None, request_bytes=0,
    )


def _event_type(dialect: str, i: int, events: int, reasoning: bool) -> str:
    if reasoning and i < events // 3:
        return "reasoning"
    if dialect == "anthropic" and i >= events - events // 5:
        return "tool_args"
    return "text"


def fixture_rows() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The request rows and chunk rows, as dicts keyed by column name."""
    requests: list[dict[str, Any]] = []
    chunks: list[dict[str, Any]] = []
    for n, day, hms, tool, model, kind, x in SPECS:
        row = _base(n, day, hms, tool, model, x)
        if kind == "stream":
            for seq, offset in enumerate(_stream(row, x)):
                chunks.append(dict(
                    request_id=row["id"], seq=seq, offset_ms=round(offset, 3), bytes=120 + seq * 7 % 50,
                    event_type=_event_type(row["dialect"], seq, x["events"], bool(x.get("reasoning"))),
                ))
        else:
            {"plain": _plain, "http": _http, "fail": _fail, "models": _models}[kind](row, x)
        requests.append(row)
    return requests, chunks


def build_fixture_db(path: str | Path) -> None:
    """Create the tables in a new DuckDB file at `path` and fill them."""
    requests, chunks = fixture_rows()
    con = duckdb.connect(str(path))
    try:
        con.execute(create_tables_sql())
        for table, names, rows in (("requests", REQUEST_COLUMN_NAMES, requests),
                                   ("chunks", CHUNK_COLUMN_NAMES, chunks)):
            marks = "(" + ", ".join("?" for _ in names) + ")"
            con.execute(  # one statement: executemany is slow in DuckDB
                f"INSERT INTO {table} ({', '.join(names)}) VALUES {', '.join(marks for _ in rows)}",
                [r[name] for r in rows for name in names],
            )
    finally:
        con.close()
