"""Credentials never reach the database, the logs, exports or error messages; captured bodies
(`--capture-bodies`, off by default) are redacted and capped."""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
from pathlib import Path

import aiohttp
import duckdb
import pytest

from proxy.common import paths
from proxy.meter.redact import REDACTED, redact
from .serving import RunningProxy

from .conftest import proxy_config, rows
from .faultkit import RawConn, RawUpstream, Serve, chunk, http_head, raw_exchange, sends_events
from .test_outcomes import closed_port

# Distinctive, and shaped like no known key format: only the exact-credential net can catch it.
KEY = "llmtap-test-credential-7Q9Zx4Kd2Lp8Vw3"


def echoing_upstream() -> RawUpstream:
    """Answers errors that quote the credential back, as some providers do."""

    async def handler(conn: RawConn) -> None:
        head = (await conn.read_request()).decode("latin-1")
        sent = re.search(r"(?im)^(?:authorization: bearer |x-api-key: |x-goog-api-key: )(\S+)", head)
        key = sent[1] if sent else re.search(r"key=([^& ]+)", head)[1]  # type: ignore[index]
        if "/v1/messages" in head:
            event = json.dumps({"type": "error", "error": {"type": "authentication_error", "message": f"bad key {key}"}})
            await conn.send(http_head(200, {"Content-Type": "text/event-stream"}, chunked=True)
                            + chunk(f"event: error\ndata: {event}\n\n".encode()) + b"0\r\n\r\n")
            return
        if "/v1beta/" in head:
            body = json.dumps([{"error": {"code": 400, "message": f"API key not valid: {key}", "status": "INVALID_ARGUMENT"}}])
        else:
            body = json.dumps({"error": {"message": f"Incorrect API key provided: {key}", "type": "invalid_request_error",
                                         "code": "invalid_api_key"}})
        await conn.send(http_head(401, {"Content-Type": "application/json"}, length=len(body)) + body.encode())

    return RawUpstream(handler)


def llmtap(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "proxy", *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout + done.stderr


async def send_traffic(base: str, port: int) -> None:
    body = {"model": "m", "stream": True, "api_key": KEY,
            "messages": [{"role": "user", "content": f"my key is {KEY}, keep it safe"}]}
    async with aiohttp.ClientSession() as s:
        for path, headers in [
            ("/v1/chat/completions", {"Authorization": f"Bearer {KEY}"}),
            ("/v1/messages", {"x-api-key": KEY}),
            ("/v1beta/models/gemini-x:generateContent", {"x-goog-api-key": KEY}),
            (f"/v1beta/models/gemini-x:streamGenerateContent?alt=sse&key={KEY}", {}),
            ("/dead/v1/chat/completions", {"Authorization": f"Bearer {KEY}"}),  # unreachable upstream
        ]:
            async with s.post(base + path, json=body, headers=headers) as r:
                await r.read()
    for raw in (  # requests aiohttp cannot parse: it logs them, with their bytes
        f"GET /v1/models?key={KEY} HTTP/1.1\r\nx-api-key: {KEY}\r\nnot a header line\r\n\r\n",
        f"GET /v1/models?key={KEY}\x01 HTTP/1.1\r\nAuthorization: Bearer {KEY}\r\n\r\n",
        f"GET /v1/models HTTP/1.1\r\nx-api-key: {KEY}\x01\r\n\r\n",
    ):
        await raw_exchange(port, raw.encode("latin-1"), timeout=2)


async def test_no_file_llmtap_writes_holds_the_key(tmp_path: Path) -> None:
    db = tmp_path / "db" / "llmtap.duckdb"
    async with echoing_upstream() as up:
        serve = await Serve(up.url, db, "--route", f"/dead=http://127.0.0.1:{closed_port()}",
                            "--capture-bodies").started()
        try:
            await send_traffic(serve.base, serve.port)
            assert serve.state is not None
            state_while_serving = serve.state.path.read_bytes()
        finally:
            assert serve.stop() == 0, serve.output()
    outputs = [
        serve.output(),
        llmtap("export", "--db", str(db), "--out", str(tmp_path / "export-parquet")),
        llmtap("export", "--db", str(db), "--out", str(tmp_path / "export-csv"), "--format", "csv"),
        llmtap("sql", "--db", str(db), "SELECT * FROM requests"),
        llmtap("sql", "--db", str(db), "SELECT * FROM bodies"),
        llmtap("errors", "--db", str(db)),
        state_while_serving.decode(),
    ]
    files = [p for root in (tmp_path, paths.data_dir()) if root.exists() for p in root.rglob("*") if p.is_file()]
    assert any(p.suffix == ".parquet" for p in files) and any(p.suffix == ".csv" for p in files)
    for text in outputs:
        assert KEY not in text and KEY[-12:] not in text, text
    for path in files:
        data = path.read_bytes()
        assert KEY.encode() not in data and KEY[-12:].encode() not in data, path

    con = duckdb.connect(str(db), read_only=True)
    messages = [m for (m,) in con.execute("SELECT error_message FROM requests ORDER BY started_at").fetchall()]
    bodies = con.execute("SELECT request_body FROM bodies").fetchall()
    con.close()
    assert len(messages) == 5 and sum(REDACTED in (m or "") for m in messages) == 4  # the echoes are there, redacted
    assert "cannot reach upstream" in messages[-1]
    assert len(bodies) == 5 and all(f"my key is {REDACTED}" in b for (b,) in bodies)
    assert "refused a malformed HTTP request" in serve.output()


# -- --capture-bodies ------------------------------------------------------------------------


SSE_REPLY = (b'data: {"choices":[{"delta":{"content":"the password is hunter2"}}]}\n\n'
             b'data: {"choices":[{"delta":{"content":" and sk-proj-abcdefghijklmnopqrstuv"}}]}\n\ndata: [DONE]\n\n')


def reply_upstream(body: bytes, headers: dict[str, str]) -> RawUpstream:
    async def handler(conn: RawConn) -> None:
        await conn.read_request()
        await conn.send(http_head(200, headers, length=len(body)) + body)
    return RawUpstream(handler)


async def test_bodies_are_not_captured_by_default(tmp_path: Path) -> None:
    async with reply_upstream(SSE_REPLY, {"Content-Type": "text/event-stream"}) as up, \
            RunningProxy(proxy_config(up.url, tmp_path)) as p:
        async with aiohttp.ClientSession() as s:
            async with s.post(p.url + "/v1/chat/completions", json={"model": "m", "stream": True}) as r:
                assert await r.read() == SSE_REPLY
        assert rows(p, "SELECT count(*) AS n FROM bodies") == [{"n": 0}]
        assert rows(p, "SELECT count(*) AS n FROM requests") == [{"n": 1}]


async def test_captured_bodies_are_decoded_redacted_and_capped(tmp_path: Path) -> None:
    request = {"model": "m", "stream": True, "password": "p4ssw0rd-value",
               "messages": [{"role": "user", "content": "use AIzaSyA1234567890abcdefghijklmnopqrstu and "
                             "sk-ant-api03-abcdefghijklmnop, header Bearer abcdefghijklmnop"}]}
    packed = gzip.compress(SSE_REPLY)  # once: the gzip header holds the time it was made
    async with reply_upstream(packed, {"Content-Type": "text/event-stream", "Content-Encoding": "gzip"}) as up, \
            RunningProxy(proxy_config(up.url, tmp_path, capture_bodies=True, capture_max_kb=1)) as p:
        async with aiohttp.ClientSession(auto_decompress=False) as s:
            async with s.post(p.url + "/v1/chat/completions", json=request, headers={"x-api-key": KEY}) as r:
                assert await r.read() == packed  # relayed compressed
            big = {"model": "m", "messages": [{"role": "user", "content": "x" * 5000}]}
            async with s.post(p.url + "/v1/chat/completions", data=gzip.compress(json.dumps(big).encode()),
                              headers={"Content-Encoding": "gzip", "Content-Type": "application/json"}) as r:
                await r.read()
        found = rows(p, "SELECT b.* FROM bodies b JOIN requests r ON r.id = b.request_id ORDER BY r.started_at")
    first, second = found
    assert '"password": "[REDACTED]"' in first["request_body"]
    assert "AIza" not in first["request_body"] and "sk-ant" not in first["request_body"]
    assert "Bearer [REDACTED]" in first["request_body"] and '"model": "m"' in first["request_body"]
    assert first["response_body"].startswith('data: {"choices":[{"delta":{"content":"the password is hunter2"}}]}')
    assert "sk-proj" not in first["response_body"] and first["response_body"].endswith("data: [DONE]\n\n")
    assert (first["request_truncated"], first["response_truncated"]) == (False, False)
    assert second["request_body"].startswith('{"model": "m"') and len(second["request_body"]) == 1024
    assert second["request_truncated"] is True


async def test_a_captured_stream_keeps_every_event_the_meter_reads_quickly(tmp_path: Path) -> None:
    """Anthropic's text deltas, compact as the API sends them, are what the meter reads without the
    SSE parser (proxy/meter/dialects/base.py Quick): captured, each is in the response body even so, and
    an error event after them sets the row's error."""
    deltas = [b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
              b'"delta":{"type":"text_delta","text":"part %d"}}\n\n' % i for i in range(20)]
    failure = b'event: error\ndata: {"type":"error","error":{"type":"overloaded_error","message":"busy"}}\n\n'
    reply = b"".join(deltas) + failure

    event_by_event = sends_events([*deltas, failure], every_s=0.01)  # one read each: the quick path takes the later ones
    async with RawUpstream(event_by_event) as up, RunningProxy(proxy_config(up.url, tmp_path, capture_bodies=True)) as p:
        async with aiohttp.ClientSession() as s:
            async with s.post(p.url + "/v1/messages", json={"model": "m", "stream": True}) as r:
                assert await r.read() == reply
        (row,) = rows(p, "SELECT r.error_type, r.output_events, b.response_body FROM requests r "
                         "JOIN bodies b ON b.request_id = r.id")
    assert row["response_body"] == reply.decode()
    assert (row["error_type"], row["output_events"]) == ("overloaded_error", 20)


@pytest.mark.parametrize("text,expected", [
    ("Incorrect API key provided: sk-proj-abcdefghijklmnop1234.", f"Incorrect API key provided: {REDACTED}."),
    ("GET /v1?alt=sse&key=AIzaSyA1234567890abcdefghijklmnopqrstu", f"GET /v1?alt=sse&key={REDACTED}"),
    ('{"api_key": "k", "max_tokens": 5, "client_secret": "a\\"b"}',
     f'{{"api_key": "{REDACTED}", "max_tokens": 5, "client_secret": "{REDACTED}"}}'),
    ('{"args": "{\\"password\\": \\"hunter2\\"}"}', f'{{"args": "{{\\"password\\": \\"{REDACTED}\\"}}"}}'),
    ("x-goog-api-key: abc123456789", f"x-goog-api-key: {REDACTED}"),
    ("max_tokens must be at most 4096; the token budget", "max_tokens must be at most 4096; the token budget"),
])
def test_redact(text: str, expected: str) -> None:
    assert redact(text) == expected


def test_redact_removes_the_exact_credentials_first() -> None:
    assert redact(f"quoted: {KEY}.", [KEY]) == f"quoted: {REDACTED}."
