"""The agents' own telemetry received by `llmtap serve` (proxy/relay/otlp.py), on real sockets: the
OpenTelemetry SDK's own OTLP/HTTP exporter and raw POSTs (protobuf and JSON), the refusals (no token,
a web page, garbage, 50 MB), and that decoding never runs on the relay's event loop.

(tests/test_otlp_receiver.py is the other direction: llmtap's own spans and metrics, exported.)
"""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import shutil
import statistics
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import aiohttp
import duckdb
import orjson
import pytest
from google.protobuf import json_format
from google.rpc.status_pb2 import Status
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

from analysis.agent_account import create_agent_views
from analysis.views import create_views
from proxy.common import instances as running
from proxy.meter import agent_events
from proxy.relay import otlp
from proxy.serve.workers import VIA_HEADER
from proxy.settings.client_key import telemetry_token
from proxy.simulator.app import Simulator
from proxy.tools.telemetry_setup import Telemetry, gemini_merge

from .conftest import proxy_config, rows
from .procfs import children
from .serving import RunningProxy
from .test_real_cli_sessions import check_tool_span, command, scripted
from .test_real_clis import CLAUDE_QUIET, CODEX_CONFIG, base_env, clis, run_cli, write_setup  # noqa: F401  (clis: a fixture)
from .test_serve_process import start_serve, stream_once
from .test_workers import fresh_connections, stop
from .test_workers import start_serve as start_workers
from .waiting import wait_until

GEMINI_SETTINGS = {"security": {"auth": {"selectedType": "gemini-api-key"}},
                   "privacy": {"usageStatisticsEnabled": False},
                   "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False}}
SECRETS = ("rm -rf /home/alice/secret-project", "/home/alice/secret-project/notes.txt", "my secret prompt",
           "alice@example.com", "TOOL-OUTPUT-SECRET")


@pytest.fixture
async def served(sim: Simulator, tmp_path: Path) -> AsyncIterator[tuple[running.AdminClient, str]]:
    proc, admin = await start_serve(sim.url, tmp_path / "otlp.duckdb", "--quiet")
    token = (Path(os.environ["LLMTAP_HOME"]) / "telemetry-token").read_text().strip()
    try:
        yield admin, token
    finally:
        stop(proc)


def claude_code_export(session: str = "sess-1", call: str = "toolu_01") -> dict[str, Any]:
    """An export as Claude Code 2.1.197 sends it with OTEL_LOG_USER_PROMPTS=1 and OTEL_LOG_TOOL_DETAILS=1
    (docs/tools.md): content in `prompt`, `tool_parameters`, `tool_input`, which is never stored."""
    def record(name: str, **attrs: Any) -> dict[str, Any]:
        base = {"event.name": name, "event.timestamp": "2026-12-05T10:00:00.500Z", "session.id": session,
                "prompt.id": "p-1", "user.email": SECRETS[3], "event.sequence": 3}
        pairs = [{"key": k, "value": {"intValue": str(v)} if isinstance(v, int) else {"stringValue": str(v)}}
                 for k, v in {**base, **attrs}.items()]
        return {"timeUnixNano": "1796464800500000000", "body": {"stringValue": f"claude_code.{name}"},
                "attributes": pairs}
    details = orjson.dumps({"bash_command": SECRETS[0], "file_path": SECRETS[1]}).decode()
    return {"resourceLogs": [{
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "claude-code"}},
                                    {"key": "service.version", "value": {"stringValue": "2.1.197"}}]},
        "scopeLogs": [{"scope": {"name": "com.anthropic.claude_code.events"}, "logRecords": [
            record("user_prompt", prompt=SECRETS[2], prompt_length=16),
            record("tool_decision", decision="accept", source="user_temporary", tool_name="Bash", tool_use_id=call),
            record("tool_result", tool_name="Bash", tool_use_id=call, success="true", duration_ms=1262,
                   tool_parameters=details, tool_input=SECRETS[0], tool_result=SECRETS[4]),
            record("api_request", model="claude-sonnet-4-5", duration_ms=2400, input_tokens=1200, output_tokens=40),
            {"body": {"stringValue": SECRETS[2]}, "attributes": []},  # a log that is no event: not kept
        ]}]}]}


def claude_code_spans() -> dict[str, Any]:
    """Claude Code's beta spans as it exports them in OTLP/JSON (ids in hex), a tool's details in them."""
    def span(name: str, span_id: str, parent: str, start_ms: int, end_ms: int, **attrs: str) -> dict[str, Any]:
        pairs = [{"key": k, "value": {"stringValue": v}}
                 for k, v in {"session.id": "sess-1", "tool_input": SECRETS[0], **attrs}.items()]
        return {"traceId": "5b8aa5a2d2c872e8321cf37308d69df2", "spanId": span_id, "parentSpanId": parent,
                "name": name, "kind": 1, "startTimeUnixNano": str(1796464800000 * 10**6 + start_ms * 10**6),
                "endTimeUnixNano": str(1796464800000 * 10**6 + end_ms * 10**6), "attributes": pairs}
    return {"resourceSpans": [{"resource": {"attributes": [
        {"key": "service.name", "value": {"stringValue": "claude-code"}}]}, "scopeSpans": [{"spans": [
            span("claude_code.tool", "1b42a8a4908526a1", "bc798759af1b8645", 0, 2000, tool_name="Bash",
                 tool_use_id="toolu_01"),
            span("claude_code.tool.blocked_on_user", "03029a9323e7c648", "1b42a8a4908526a1", 0, 750,
                 decision="accept", source="user_temporary"),
            span("claude_code.tool.execution", "9e69c3ad5c0ec73d", "1b42a8a4908526a1", 760, 1960,
                 tool_use_id="toolu_01", command=SECRETS[0]),
            span("claude_code.interaction", "bc798759af1b8645", "", 0, 3000, user_prompt=SECRETS[2])]}]}]}


async def post(s: aiohttp.ClientSession, url: str, body: bytes, content_type: str, token: str | None,
               signal: str = "v1/logs", **headers: str) -> tuple[int, bytes, str]:
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    async with s.post(url + otlp.PREFIX + signal, data=body,
                      headers={"Content-Type": content_type, **headers}) as r:
        return r.status, await r.read(), r.content_type


async def sql(admin: running.AdminClient, query: str) -> list[tuple[Any, ...]]:
    (_columns, _types, rows), _ = await asyncio.to_thread(admin.sql, query)
    return rows


def rpc_status(body: bytes, content_type: str) -> Status:
    status = Status()
    if content_type == agent_events.JSON:
        json_format.Parse(body, status)
    else:
        status.ParseFromString(body)
    return status


async def test_the_sdk_exporter_and_a_json_export_are_stored_without_content(served: Any) -> None:
    admin, token = served
    from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
    from opentelemetry.sdk.resources import Resource

    def export_with_the_sdk() -> None:  # protobuf, as every OTel SDK sends it by default
        exporter = OTLPLogExporter(endpoint=admin.url + otlp.PREFIX + "v1/logs",
                                   headers={"Authorization": f"Bearer {token}"})
        provider = LoggerProvider(resource=Resource.create({"service.name": "codex_exec"}))
        provider.add_log_record_processor(SimpleLogRecordProcessor(exporter))
        logger = provider.get_logger("codex")
        logger.emit(body="codex.tool_result", attributes={
            "event.name": "codex.tool_result", "conversation.id": "conv-9", "call_id": "call_7",
            "tool_name": "exec_command", "duration_ms": 1204, "success": "true",
            "arguments": SECRETS[0], "output": SECRETS[4]})
        provider.shutdown()

    await asyncio.to_thread(export_with_the_sdk)
    async with aiohttp.ClientSession() as s:
        status, body, kind = await post(s, admin.url, orjson.dumps(claude_code_export()), "application/json", token)
    assert (status, body, kind) == (200, b"{}", "application/json")
    rows = await sql(admin, "SELECT source, session_id, event_name, tool_name, call_id, decision, decision_source, "
                            "duration_ms, success, sequence, prompt_id, input_tokens FROM agent_events "
                            "ORDER BY source, event_name")
    assert rows == [
        ("claude-code", "sess-1", "claude_code.api_request", None, None, None, None, 2400.0, None, 3, "p-1", 1200),
        ("claude-code", "sess-1", "claude_code.tool_decision", "Bash", "toolu_01", "accept", "user_temporary",
         None, None, 3, "p-1", None),
        ("claude-code", "sess-1", "claude_code.tool_result", "Bash", "toolu_01", None, None, 1262.0, True, 3, "p-1",
         None),
        ("claude-code", "sess-1", "claude_code.user_prompt", None, None, None, None, None, None, 3, "p-1", None),
        ("codex_exec", "conv-9", "codex.tool_result", "exec_command", "call_7", None, None, 1204.0, True, None, None,
         None),
    ]
    (event_at,) = (await sql(admin, "SELECT DISTINCT event_at FROM agent_events WHERE source = 'claude-code'"))[0]
    assert datetime.fromisoformat(event_at) == datetime(2026, 12, 5, 10, 0, 0, 500000, tzinfo=timezone.utc)
    async with aiohttp.ClientSession() as s:  # Claude Code's beta spans, with OTEL_LOG_TOOL_DETAILS=1
        status, _, _ = await post(s, admin.url, orjson.dumps(claude_code_spans()), "application/json", token,
                                  signal="v1/traces")
    assert status == 200
    assert await sql(admin, "SELECT event_name, call_id, duration_ms, span_id, parent_span_id, decision_source "
                            "FROM agent_events WHERE span_id IS NOT NULL ORDER BY event_name") == [
        ("claude_code.tool", "toolu_01", 2000.0, "1b42a8a4908526a1", "bc798759af1b8645", None),
        ("claude_code.tool.blocked_on_user", None, 750.0, "03029a9323e7c648", "1b42a8a4908526a1", "user_temporary"),
        ("claude_code.tool.execution", "toolu_01", 1200.0, "9e69c3ad5c0ec73d", "1b42a8a4908526a1", None)]
    everything = orjson.dumps(await sql(admin, "SELECT * FROM agent_events"), default=str).decode()
    assert not [secret for secret in SECRETS if secret in everything]


async def test_refused_a_web_page_a_missing_token_garbage_and_nothing_stored(served: Any) -> None:
    admin, token = served
    export = orjson.dumps(claude_code_export())
    protobuf = ExportLogsServiceRequest()
    json_format.Parse(export, protobuf)
    async with aiohttp.ClientSession() as s:
        refused = [
            await post(s, admin.url, export, "application/json", None),
            await post(s, admin.url, export, "application/json", "llmtap-otlp-wrong"),
            await post(s, admin.url, export, "application/json", admin.token),  # the admin token is not this one
            await post(s, admin.url, export, "text/plain", token, Origin="https://evil.example"),
            await post(s, admin.url, export, "application/json", token, Origin="https://evil.example"),
            await post(s, admin.url, export, "application/json", token, **{"Sec-Fetch-Site": "cross-site"}),
            await post(s, admin.url, b"\x0a\xff\xff\xff\xff garbage", "application/x-protobuf", token),
            await post(s, admin.url, b"{not json", "application/json", token),
            await post(s, admin.url, b'{"resourceLogs": 7}', "application/json", token),
            await post(s, admin.url, export, "text/plain", token),
        ]
        async with s.options(admin.url + otlp.PREFIX + "v1/logs", headers={
                "Origin": "https://evil.example", "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization"}) as r:
            preflight = r.status, r.headers.get("Access-Control-Allow-Origin")
        ok = await post(s, admin.url, protobuf.SerializeToString(), "application/x-protobuf", token)
        async with s.post(f"{admin.url}{otlp.PREFIX}{token}/v1/logs", data=export,  # the token as the endpoint's
                          headers={"Content-Type": "application/json"}) as r:  # segment: Gemini CLI's settings
            in_path = r.status
        async with s.post(f"{admin.url}{otlp.PREFIX}llmtap-otlp-guessed/v1/logs", data=export,
                          headers={"Content-Type": "application/json"}) as r:
            wrong_in_path = r.status
    assert [status for status, _, _ in refused] == [401, 401, 401, 403, 403, 403, 400, 400, 400, 415]
    assert [rpc_status(body, kind).code for _, body, kind in refused] == [16, 16, 16, 7, 7, 7, 3, 3, 3, 3]
    assert preflight == (403, None)
    assert ok == (200, b"", "application/x-protobuf")
    assert (in_path, wrong_in_path) == (200, 401)
    assert await sql(admin, "SELECT count(*) FROM agent_events") == [(8,)]  # the two exports allowed, only
    assert await sql(admin, "SELECT path, status, error_type FROM requests WHERE path LIKE '/_llmtap/otlp/%' "
                            "ORDER BY 2, 3") == \
        [("/_llmtap/otlp/v1/logs", 401, "telemetry_unauthenticated")] * 4 + \
        [("/_llmtap/otlp/v1/logs", 403, "refused_web_page")] * 4


def accounts(db: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The `tool_run_accounts` and `api_request_accounts` views of a database file (analysis/agent_account.py)."""
    con = duckdb.connect(str(db), read_only=True)
    try:
        create_views(con)
        assert create_agent_views(con)
        found = []
        for view in ("tool_run_accounts", "api_request_accounts"):
            cur = con.execute(f"SELECT * FROM {view} ORDER BY 1, 2, 3")
            names = [d[0] for d in cur.description]
            found.append([dict(zip(names, row)) for row in cur.fetchall()])
        return found[0], found[1]
    finally:
        con.close()


async def reported(p: RunningProxy, *names: str) -> list[dict[str, Any]]:
    """The proxy's agent_events, once they hold each of `names` (the CLI exports as it ends)."""
    def events() -> list[dict[str, Any]]:
        return rows(p, "SELECT * FROM agent_events ORDER BY event_at")

    await wait_until(lambda: set(names) <= {e["event_name"] for e in events()}, 60, f"{', '.join(names)} received")
    return events()


def session_split(db: Path, tool: str, command_ms: float, duration_ms: float) -> dict[str, float]:
    """`llmtap session` of the database's one session, as JSON: its accounts, and the tool call's span split
    (analysis/timeline.py) into approval (you), the tool's run and the agent's own time, in ms. The run is
    the command's own plus at most RUN_SLACK_MS (the CLI's work around the process), or the CLI's own
    duration_ms when that is longer; the totals make the wall."""
    from click.testing import CliRunner

    from proxy.cli import main

    result = CliRunner().invoke(main, ["sessions", "--db", str(db), "--since", "all", "--format", "json"])
    [listed] = json.loads(result.output)
    shown = json.loads(CliRunner().invoke(main, ["session", listed["session"], "--db", str(db), "--since", "all",
                                                 "--format", "json"]).output)
    assert listed["accounts"] == shown["accounts"] == "wire + agent"
    print(CliRunner().invoke(main, ["session", listed["session"], "--db", str(db), "--since", "all"]).output)
    spans = shown["spans"]
    print("\n".join(f"  {sp['start_s']:8.3f} {sp['kind']:6} {sp['part']:10} {sp['seconds']} {sp['request_id'][:8]}"
                    for sp in spans) + f"\n  load {os.getloadavg()[0]:.1f}")
    [run] = [sp for sp in spans if sp["kind"] == "tool" and sp["part"] == tool and not sp["open"]]
    asking = run["request_id"]
    split = {"approval": 1000 * sum(sp["seconds"] for sp in spans if sp["part"] == "approving" and sp["request_id"] == asking),
             "run": 1000 * run["seconds"],
             "agent": 1000 * sum(sp["seconds"] for sp in spans if sp["kind"] == "agent" and sp["request_id"] == asking)}
    t = shown["totals"]
    assert t["model_s"] + t["tool_s"] + t["agent_s"] + t["you_s"] + t["other_s"] == pytest.approx(shown["wall_s"], abs=0.01)
    print(f"  llmtap session: approval {split['approval']:.0f} ms (you), {tool}'s run {split['run']:.0f} ms, the agent's "
          f"own {split['agent']:.0f} ms (the command's own run {command_ms:.0f} ms, the agent's duration_ms {duration_ms:.0f})")
    # at most the CLI's own account of the run when it says it took longer (spawning a shell on a busy machine)
    assert command_ms - 5 <= split["run"] <= max(command_ms + RUN_SLACK_MS, duration_ms + 50), (split, command_ms)
    return split


RUN_SLACK_MS = 250  # the most a CLI's tool run may take beyond its command's own (spawning a shell, reading its output)


def loaded(idle: float, busy: float) -> float:
    """A tolerance for a CLI's own work: `busy` on a shared machine under load (a load of 10 on 2 cores
    slows Claude Code's spawning and its prompt by hundreds of ms), else `idle`."""
    return idle if os.getloadavg()[0] < 4 else busy


def print_api(api: list[dict[str, Any]]) -> None:
    for a in api:
        print(f"  {a['event_name']}: the agent's {a['agent_ms']:.0f} ms, llmtap's {a['measure']} "
              f"{a['wire_ms']:.0f} ms: the agent's client-side time {a['client_ms']:.0f} ms")


def post_blocking(url: str, body: Any, token: str) -> tuple[int, int]:
    """A POST of `body` (bytes: with its Content-Length; an iterable: chunked); its status and rpc code."""
    request = urllib.request.Request(url + otlp.PREFIX + "v1/logs", data=body, method="POST", headers={
        "Content-Type": "application/x-protobuf", "Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, 0
    except urllib.error.HTTPError as exc:
        return exc.code, rpc_status(exc.read(), agent_events.PROTOBUF).code


def health_lag(admin: running.AdminClient) -> float:
    health = admin.health()
    assert health is not None
    return float(health["event_loop_lag"]["max_ms"])


async def test_a_big_export_is_decoded_off_the_event_loop_and_50_mb_get_a_413(served: Any) -> None:
    """An export under the limit that takes its decoder a long while (OTLP/JSON's json_format: over a second
    for 4 MiB) is decoded while streams relay: were it decoded on the event loop, the loop would stall that
    long, and its lag (health's, sampled every 50 ms) would show it. Then 50 MB, declared and chunked: 413s,
    and the streams meanwhile as fast as before."""
    admin, token = served
    record = claude_code_export()["resourceLogs"][0]["scopeLogs"][0]["logRecords"][2]
    big = claude_code_export()
    big["resourceLogs"][0]["scopeLogs"][0]["logRecords"] = [record] * 4000
    body = orjson.dumps(big)
    assert len(body) < otlp.MAX_EXPORT_BYTES
    started = time.perf_counter()
    agent_events.decode("v1/logs", body, "application/json", None, otlp.MAX_EXPORT_BYTES, datetime.now(timezone.utc))
    decode_ms = (time.perf_counter() - started) * 1000
    assert decode_ms > 500  # what a stall would be, were it on the loop

    async with aiohttp.ClientSession() as s:
        for _ in range(5):
            await stream_once(s, admin.url)
        assert health_lag(admin) < decode_ms / 4
        streams = asyncio.gather(*(stream_once(s, admin.url) for _ in range(20)))
        status, _, _ = await post(s, admin.url, body, "application/json", token)
        await streams
        assert status == 200
        assert await sql(admin, "SELECT count(*) FROM agent_events") == [(4000,)]
        lag_ms = await asyncio.to_thread(health_lag, admin)
        assert lag_ms < decode_ms / 4, f"the loop stalled {lag_ms} ms for a {decode_ms:.0f} ms decode"

        # sent from a thread: the simulated upstream shares this test's event loop
        fifty = b"x" * (50 * 1024 * 1024)
        streams = asyncio.gather(*(stream_once(s, admin.url) for _ in range(10)))
        declared = await asyncio.to_thread(post_blocking, admin.url, fifty, token)
        sent_chunked = await asyncio.to_thread(post_blocking, admin.url, (fifty[i:i + (1 << 20)] for i in
                                                                           range(0, len(fifty), 1 << 20)), token)
        await streams
    assert declared == sent_chunked == (413, 8)
    assert await sql(admin, "SELECT count(*) FROM agent_events") == [(4000,)]
    ttfts = [t for (t,) in await sql(admin, "SELECT ttft_ms FROM requests WHERE path = '/v1/chat/completions' "
                                            "ORDER BY started_at")]
    before, during = statistics.median(ttfts[:5]), statistics.median(ttfts[-10:])  # a shared machine's noise:
    assert during < before * 3 + 30, (ttfts[:5], ttfts[-10:])  # medians, not one outlier


@pytest.mark.real_cli
@pytest.mark.timeout(300)
async def test_real_claude_code_reports_its_tool_run_with_the_wires_ids(clis: Path, tmp_path: Path) -> None:
    """`claude -p --allowedTools Bash`, set up by `llmtap setup claude-code --write` (telemetry on), runs a
    command that notes its own start and end: its tool_decision and tool_result reach agent_events with
    the wire's session id and `tool_use` id, and the three accounts of the run are printed."""
    marks = tmp_path / "marks"
    cfg = scripted("Bash", {"command": command(marks), "description": "Sleep a while"})
    home = tmp_path / "home"
    async with Simulator(cfg) as sim, RunningProxy(proxy_config(sim.url, tmp_path)) as p:
        write_setup("claude-code", "--base-url", p.url, env={"HOME": str(home), "CLAUDE_CONFIG_DIR": None},
                    telemetry=True)
        quiet = {k: v for k, v in CLAUDE_QUIET.items() if k != "DISABLE_TELEMETRY"}
        env = base_env(home, **quiet)
        code, out, err = await run_cli([str(clis / "node_modules/.bin/claude"), "-p", "run the check",
                                        "--allowedTools", "Bash"], env, tmp_path)
        assert code == 0, out + err
        agent = await reported(p, "claude_code.tool_result", "claude_code.tool.execution")
        wire = rows(p, "SELECT session_id, tool_calls FROM requests WHERE tool_calls IS NOT NULL")
    [(session_id, calls)] = [(w["session_id"], w["tool_calls"]) for w in wire]
    print("\n" + "\n".join(f"{e['event_at']} {e['event_name']} {e['call_id']} {e['decision_source']} "
                           f"{e['duration_ms']}" for e in agent))
    found = {e["event_name"]: e for e in agent if e["call_id"] is not None}
    decision, result = found["claude_code.tool_decision"], found["claude_code.tool_result"]
    assert decision["call_id"] == result["call_id"] == calls[0]["id"]
    assert decision["session_id"] == result["session_id"] == session_id
    assert (decision["decision"], decision["decision_source"], result["tool_name"]) == ("accept", "config", "Bash")
    times = [float(t) for t in marks.read_text().split()]
    command_ms = (times[1] - times[0]) * 1000
    figures = check_tool_span(tmp_path / "llmtap.duckdb", marks, "Bash")
    assert command_ms <= result["duration_ms"] + 5 <= figures["span_s"] * 1000 + 10
    print(f"\nClaude Code Bash: the command's own run {command_ms:.0f} ms, Claude Code's duration_ms "
          f"{result['duration_ms']:.0f}, llmtap's tool span {figures['span_s'] * 1000:.0f} ms")
    [run], api = accounts(tmp_path / "llmtap.duckdb")
    [execution] = [e for e in agent if e["event_name"] == "claude_code.tool.execution"]
    assert execution["call_id"] == calls[0]["id"] and command_ms <= execution["duration_ms"] + 5
    assert (run["accounts"], run["call_id"], run["approval_ms"], run["tool_ms"]) == (
        "wire+agent", calls[0]["id"], None, execution["duration_ms"])
    assert run["agent_ms"] == pytest.approx(run["span_ms"] - run["tool_ms"])
    print(f"  its tool.execution span {execution['duration_ms']:.0f} ms; the agent's own time {run['agent_ms']:.0f} ms")
    assert session_split(tmp_path / "llmtap.duckdb", "Bash", command_ms, result["duration_ms"])["approval"] == 0
    assert len(api) == 2 and all(a["request_id"] is not None and a["client_ms"] >= 0 for a in api), api
    print_api(api)


@pytest.mark.real_cli
@pytest.mark.timeout(300)
async def test_real_codex_reports_its_tool_run_with_the_wires_ids(clis: Path, tmp_path: Path) -> None:
    """`codex exec` set up by `llmtap setup codex --write` ([otel] to llmtap) runs `exec_command`: its
    tool_result reaches agent_events with the wire's `call_id`, and joins the wire's tool run."""
    marks = tmp_path / "marks"
    cfg = scripted("exec_command", {"cmd": command(marks)})
    home = tmp_path / "home"
    codex_home = home / ".codex"
    codex_home.mkdir(parents=True)
    (codex_home / "config.toml").write_text(CODEX_CONFIG)
    async with Simulator(cfg) as sim, RunningProxy(proxy_config(sim.url, tmp_path)) as p:
        write_setup("codex", "--base-url", p.url, "--env-key", "TAP_API_KEY", "--codex-login", "api-key",
                    env={"HOME": str(home), "CODEX_HOME": str(codex_home)}, telemetry=True)
        env = base_env(home, CODEX_HOME=str(codex_home), TAP_API_KEY="sk-test")
        code, out, err = await run_cli([str(clis / "node_modules/.bin/codex"), "exec", "--skip-git-repo-check",
                                        "--dangerously-bypass-approvals-and-sandbox", "run the check"], env, tmp_path)
        assert code == 0, out + err
        agent = await reported(p, "codex.tool_result")
        wire = rows(p, "SELECT session_id, tool_calls FROM requests WHERE tool_calls IS NOT NULL")
    print("\n" + "\n".join(f"{e['event_at']} {e['event_name']} {e['session_id']} {e['call_id']} "
                           f"{e['decision_source']} {e['duration_ms']}" for e in agent))
    [(session_id, calls)] = [(w["session_id"], w["tool_calls"]) for w in wire]
    [result] = [e for e in agent if e["event_name"] == "codex.tool_result"]
    assert (result["call_id"], result["session_id"], result["tool_name"]) == (calls[0]["id"], session_id,
                                                                               "exec_command")
    times = [float(t) for t in marks.read_text().split()]
    command_ms = (times[1] - times[0]) * 1000
    figures = check_tool_span(tmp_path / "llmtap.duckdb", marks, "exec_command")
    [run], api = accounts(tmp_path / "llmtap.duckdb")
    assert (run["accounts"], run["tool_ms"]) == ("wire+agent", result["duration_ms"])
    assert command_ms <= result["duration_ms"] + 5 <= figures["span_s"] * 1000 + 10
    print(f"\nCodex exec_command: the command's own run {command_ms:.0f} ms, Codex's duration_ms "
          f"{result['duration_ms']:.0f}, llmtap's tool span {figures['span_s'] * 1000:.0f} ms")
    session_split(tmp_path / "llmtap.duckdb", "exec_command", command_ms, result["duration_ms"])
    print_api(api)
    assert all(a["request_id"] is not None and a["client_ms"] >= 0 for a in api), [(a["request_id"], a["client_ms"]) for a in api]


@pytest.mark.real_cli
@pytest.mark.timeout(300)
async def test_real_gemini_cli_reports_its_tool_call_joined_by_name_and_time(tmp_path: Path) -> None:
    """Gemini CLI (its settings' `telemetry`, as telemetry_setup writes them: the token in the endpoint) runs
    `run_shell_command`: its `gemini_cli.tool_call` has no call id, and joins the wire's call by name and
    time."""
    binary = Path(os.environ.get("LLMTAP_CLI_CACHE") or Path.home() / ".cache" / "llmtap-test-clis") / \
        "agents" / "node_modules" / ".bin" / "gemini"
    if not binary.exists():
        pytest.skip(f"no Gemini CLI at {binary} (tests/test_real_agents.py installs it)")
    marks = tmp_path / "marks"
    cfg = scripted("run_shell_command", {"command": command(marks), "description": "Sleep a while"})
    home = tmp_path / "home"
    (home / ".gemini").mkdir(parents=True)
    async with Simulator(cfg) as sim, RunningProxy(proxy_config(sim.url, tmp_path)) as p:
        settings, note = gemini_merge(GEMINI_SETTINGS, Telemetry(p.url, telemetry_token()))
        assert note is None
        (home / ".gemini" / "settings.json").write_text(json.dumps(settings))
        env = base_env(home, GEMINI_API_KEY="sk-test", GEMINI_CLI_TRUST_WORKSPACE="true",
                       GOOGLE_GEMINI_BASE_URL=p.url)
        code, out, err = await run_cli([str(binary), "-p", "run the check", "--yolo", "-m", "gemini-2.5-pro"],
                                       env, tmp_path)
        assert code == 0, out + err
        agent = await reported(p, "gemini_cli.tool_call")
    print("\n" + "\n".join(f"{e['event_at']} {e['event_name']} {e['session_id']} {e['tool_name']} "
                           f"{e['decision']} {e['duration_ms']}" for e in agent))
    [call] = [e for e in agent if e["event_name"] == "gemini_cli.tool_call"]
    times = [float(t) for t in marks.read_text().split()]
    command_ms = (times[1] - times[0]) * 1000
    runs, api = accounts(tmp_path / "llmtap.duckdb")
    [run] = [r for r in runs if r["name"] == "run_shell_command"]
    assert (run["accounts"], run["tool_ms"], call["call_id"]) == ("wire+agent", call["duration_ms"], None)
    assert command_ms <= call["duration_ms"] + 5
    span = f"{run['span_ms']:.0f} ms" if run["span_ms"] is not None else "open (its result's made-up id)"
    print(f"\nGemini CLI run_shell_command: the command's own run {command_ms:.0f} ms, Gemini CLI's duration_ms "
          f"{call['duration_ms']:.0f}, llmtap's tool span {span}")
    session_split(tmp_path / "llmtap.duckdb", "run_shell_command", command_ms, call["duration_ms"])
    print_api([a for a in api if a["request_id"] is not None])


APPROVAL_S = 3.0  # how long the person takes to approve, in the interactive test
TMUX_KEY = "sk-ant-api03-llmtap-interactive-test-0123456789"


def tmux(*args: str) -> str:
    return subprocess.run(["tmux", *args], capture_output=True, text=True, timeout=10, check=True).stdout


@pytest.mark.real_cli
@pytest.mark.timeout(300)
async def test_real_interactive_claude_code_an_approval_is_the_persons_time(clis: Path, tmp_path: Path) -> None:
    """Claude Code in tmux, in its default permission mode: the model asks for `Bash`, the person waits
    APPROVAL_S at "Do you want to proceed?", then approves. The agent's tool_decision (source: the person)
    splits the wire's tool span: the wait lands with the person, the rest is the command's run and the
    agent's own time."""
    if shutil.which("tmux") is None:
        pytest.skip("no tmux to run Claude Code interactively in")
    marks = tmp_path / "marks"
    cfg = scripted("Bash", {"command": command(marks), "description": "Sleep a while"})
    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    session = f"llmtap-otel-{os.getpid()}"
    async with Simulator(cfg) as sim, RunningProxy(proxy_config(sim.url, tmp_path)) as p:
        write_setup("claude-code", "--base-url", p.url, env={"HOME": str(home), "CLAUDE_CONFIG_DIR": None},
                    telemetry=True)
        (home / ".claude.json").write_text(json.dumps({
            "hasCompletedOnboarding": True, "theme": "dark", "numStartups": 5,
            "customApiKeyResponses": {"approved": [TMUX_KEY[-20:]], "rejected": []},
            "projects": {str(work): {"hasTrustDialogAccepted": True, "allowedTools": []}}}))
        quiet = {k: v for k, v in CLAUDE_QUIET.items() if k != "DISABLE_TELEMETRY"}
        env = {**base_env(home, **quiet), "ANTHROPIC_API_KEY": TMUX_KEY, "TERM": "xterm-256color"}
        argv = ["env", "-i", *(f"{k}={v}" for k, v in env.items()), str(clis / "node_modules/.bin/claude")]
        tmux("new-session", "-d", "-s", session, "-x", "160", "-y", "45", "-c", str(work), *argv)
        try:
            screen = lambda: tmux("capture-pane", "-p", "-t", session)  # noqa: E731
            await wait_until(lambda: "for shortcuts" in screen() or "? " in screen(), 30, "Claude Code's prompt")
            tmux("send-keys", "-t", session, "-l", "run the check")
            tmux("send-keys", "-t", session, "Enter")
            await wait_until(lambda: "Do you want to proceed?" in screen(), 60, "the permission prompt")
            asked = time.time()
            await asyncio.sleep(APPROVAL_S)  # the person reading the prompt: the wait this test measures
            tmux("send-keys", "-t", session, "Enter")
            approved = time.time()
            agent = await reported(p, "claude_code.tool_result", "claude_code.tool.execution",
                                   "claude_code.tool.blocked_on_user")
            await wait_until(lambda: rows(p, "SELECT count(*) AS n FROM requests WHERE tool_results IS NOT NULL")[0]
                             ["n"] > 0, 60, "the request carrying the result")
            tmux("send-keys", "-t", session, "-l", "/exit")
            tmux("send-keys", "-t", session, "Enter")
        finally:
            subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
        assert p.flush(10)
        sent = rows(p, "SELECT kind, request_model, max_tokens, stream, message_count, tool_results IS NOT NULL AS results"
                       " FROM requests WHERE kind IN ('generation', 'side') ORDER BY started_at")
    print("\nits generations and side requests:\n" + "\n".join(map(str, sent)))
    # the turns declare tools: generations; what it sends beside them without (a title) is `side` (#43)
    main = next(r["request_model"] for r in sent if r["results"])
    assert [r["kind"] for r in sent if r["request_model"] == main] == ["generation", "generation"], sent
    assert {r["kind"] for r in sent if r["request_model"] != main} == {"side"}, sent
    print("\n" + "\n".join(f"{e['event_at']} {e['event_name']} {e['call_id']} {e['decision']} "
                           f"{e['decision_source']} {e['duration_ms']}" for e in agent))
    times = [float(t) for t in marks.read_text().split()]
    command_ms = (times[1] - times[0]) * 1000
    runs, _api = accounts(tmp_path / "llmtap.duckdb")
    [run] = [r for r in runs if r["name"] == "Bash" and r["span_ms"] is not None]
    [result] = [e for e in agent if e["event_name"] == "claude_code.tool_result"]
    [decision] = [e for e in agent if e["event_name"] == "claude_code.tool_decision"]
    decided_ms = (decision["event_at"] - run["asked_at"]).total_seconds() * 1000
    print(f"\ninteractive Claude Code: the prompt shown to approved {(approved - asked) * 1000:.0f} ms (the test "
          f"waited {APPROVAL_S * 1000:.0f}); llmtap's tool span {run['span_ms']:.0f} ms = approval "
          f"{run['approval_ms']:.0f} ms + Bash's run (its tool.execution span) {run['tool_ms']:.0f} ms + the "
          f"agent's own {run['agent_ms']:.0f} ms; the command's own run {command_ms:.0f} ms, its tool_result's "
          f"duration_ms {result['duration_ms']:.0f}; its tool_decision {decided_ms:.0f} ms after the span's start")
    assert run["accounts"] == "wire+agent" and run["decision_source"].startswith("user")
    # the person's wait, and Claude Code's own time to put the prompt up (some 200 ms here on an idle machine,
    # 500 under a load of 10 on 2 cores): the wait as the test saw the screen, within its polling
    waited_ms = (approved - asked) * 1000
    assert waited_ms - 100 <= run["approval_ms"] <= waited_ms + 1000, (run["approval_ms"], waited_ms)
    assert command_ms <= run["tool_ms"] + 5 and run["agent_ms"] >= 0
    assert run["approval_ms"] + run["tool_ms"] + run["agent_ms"] == pytest.approx(run["span_ms"])
    split = session_split(tmp_path / "llmtap.duckdb", "Bash", command_ms, result["duration_ms"])
    slack = loaded(300, 1000)  # Claude Code's own time to put the prompt up
    print(f"  the approval recorded {split['approval']:.0f} ms against the {waited_ms:.0f} ms waited")
    assert abs(split["approval"] - waited_ms) <= slack, (split, waited_ms)


async def test_serve_workers_take_exports_on_either_process(sim: Simulator, tmp_path: Path) -> None:
    """`serve --workers 2`: an export a worker takes is checked there and stored by the primary, gzip too."""
    proc, state = await start_workers(sim.url, tmp_path / "workers.duckdb")
    admin = running.AdminClient(state.url, state.admin_token)
    token = (Path(os.environ["LLMTAP_HOME"]) / "telemetry-token").read_text().strip()
    body = orjson.dumps(claude_code_export())
    try:
        async with fresh_connections() as s:
            statuses, via = [], set()
            for i in range(20):
                async with s.post(state.url + otlp.PREFIX + "v1/logs", data=gzip.compress(body) if i % 2 else body,
                                  headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}",
                                           **({"Content-Encoding": "gzip"} if i % 2 else {})}) as r:
                    statuses.append(r.status)
                    via.add(r.headers.get(VIA_HEADER))
            refused = [(await post(s, state.url, body, "application/json", None))[0] for _ in range(10)]
        assert statuses == [200] * 20 and via == {None, "1"} and refused == [401] * 10
        assert await sql(admin, "SELECT count(*) FROM agent_events") == [(80,)]
    finally:
        stop(proc)


async def test_a_storm_of_exports_gets_429s_past_the_ones_under_way(served: Any) -> None:
    """At most MAX_PENDING exports are read or decoded at once; the others are answered at once with a 429
    and Retry-After (the SDKs retry), their bodies unread, and nothing of them stored."""
    admin, token = served
    big = claude_code_export()
    big["resourceLogs"][0]["scopeLogs"][0]["logRecords"] *= 500  # 2,500 records: a long decode each
    body = orjson.dumps(big)
    async with aiohttp.ClientSession() as s:

        async def one() -> tuple[int, str | None, int]:
            async with s.post(admin.url + otlp.PREFIX + "v1/logs", data=body, headers={
                    "Content-Type": "application/json", "Authorization": f"Bearer {token}"}) as r:
                answer = await r.read()
                return r.status, r.headers.get("Retry-After"), rpc_status(answer, r.content_type).code if \
                    r.status != 200 else 0

        answers = await asyncio.gather(*(one() for _ in range(3 * otlp.MAX_PENDING)))
    taken = [a for a in answers if a[0] == 200]
    assert otlp.MAX_PENDING <= len(taken) < len(answers)
    assert set(answers) - set(taken) == {(429, str(otlp.RETRY_AFTER_S), 8)}
    assert await sql(admin, "SELECT count(*) FROM agent_events") == [(len(taken) * 2000,)]


async def test_the_decoding_process_ends_with_a_killed_proxy(sim: Simulator, tmp_path: Path) -> None:
    proc, admin = await start_serve(sim.url, tmp_path / "killed.duckdb", "--quiet")
    token = (Path(os.environ["LLMTAP_HOME"]) / "telemetry-token").read_text().strip()
    try:
        async with aiohttp.ClientSession() as s:
            assert (await post(s, admin.url, orjson.dumps(claude_code_export()), "application/json", token))[0] == 200
        started = children(proc.pid)[1:]
        assert started  # the decoding process (and multiprocessing's resource tracker)
    finally:
        proc.kill()
        proc.wait()  # not communicate(): its pipes stay open while an orphan holds them
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
    await wait_until(lambda: not [pid for pid in started if Path(f"/proc/{pid}").exists()], 10,
                     "the decoding process's end")
