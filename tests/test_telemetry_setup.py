"""`llmtap setup TOOL --write` points each CLI's own OpenTelemetry at llmtap (proxy/tools/telemetry_setup.py):
with the telemetry token, in an owner-only file; a user's own collector is never overwritten;
`--no-telemetry` leaves it all out; `llmtap doctor` says whether each one's telemetry reaches llmtap."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import time
import tomllib
from pathlib import Path

import aiohttp
from click.testing import CliRunner

from proxy.common.instances import LiveProxy
from proxy.settings.client_key import telemetry_token
from proxy.simulator.app import Simulator
from proxy.tools import telemetry_checks
from proxy.tools.cli import setup
from proxy.tools.telemetry_setup import Telemetry, gemini_merge

from .conftest import proxy_config
from .serving import RunningProxy

URL = "http://127.0.0.1:9911"
ENDPOINT = URL + "/_llmtap/otlp"


def invoke(home: Path, *args: str) -> tuple[int, str]:
    clean = {"HOME": str(home), "CODEX_HOME": None, "CLAUDE_CONFIG_DIR": None}
    result = CliRunner().invoke(setup, [*args, "--base-url", URL + "/anthropic"], env=clean)
    return result.exit_code, result.output


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_claude_code_gets_its_telemetry_variables_owner_only_and_once(tmp_path: Path) -> None:
    settings = tmp_path / ".claude" / "settings.json"
    settings.parent.mkdir()
    settings.write_text(json.dumps({"env": {"FOO": "1"}, "model": "opus"}))
    settings.chmod(0o644)
    code, out = invoke(tmp_path, "claude-code", "--write")
    assert code == 0, out
    token = telemetry_token()
    assert json.loads(settings.read_text()) == {"model": "opus", "env": {
        "FOO": "1", "ANTHROPIC_BASE_URL": URL + "/anthropic", "CLAUDE_CODE_ENABLE_TELEMETRY": "1",
        "OTEL_LOGS_EXPORTER": "otlp", "OTEL_METRICS_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json",
        "OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT, "OTEL_EXPORTER_OTLP_HEADERS": f"Authorization=Bearer {token}",
        "OTEL_LOGS_EXPORT_INTERVAL": "500", "CLAUDE_CODE_ENHANCED_TELEMETRY_BETA": "1", "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_TRACES_EXPORT_INTERVAL": "500"}}
    assert mode(settings) == 0o600 and mode(Path(os.environ["LLMTAP_HOME"]) / "telemetry-token") == 0o600
    code, out = invoke(tmp_path, "claude-code", "--write")
    assert out.splitlines()[-1] == f"{settings} already has this configuration: nothing written"


def test_a_users_own_collector_is_kept_and_no_telemetry_leaves_it_out(tmp_path: Path) -> None:
    settings = tmp_path / ".claude" / "settings.json"
    settings.parent.mkdir()
    own = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector.internal:4318", "CLAUDE_CODE_ENABLE_TELEMETRY": "1"}
    settings.write_text(json.dumps({"env": own}))
    settings.chmod(0o644)
    code, out = invoke(tmp_path, "claude-code", "--write")
    assert code == 0, out
    assert "Claude Code already sends its telemetry to http://collector.internal:4318: left as it is" in out
    assert json.loads(settings.read_text()) == {"env": {**own, "ANTHROPIC_BASE_URL": URL + "/anthropic"}}
    assert mode(settings) == 0o644  # no credential of llmtap's in it

    codex = tmp_path / ".codex" / "config.toml"
    codex.parent.mkdir()
    theirs = '[otel]\nexporter = { otlp-grpc = { endpoint = "http://collector.internal:4317" } }\n'
    codex.write_text(theirs)
    code, out = invoke(tmp_path, "codex", "--write")
    assert "Codex already sends its telemetry to http://collector.internal:4317: left as it is" in out
    assert theirs in codex.read_text() and "_llmtap/otlp" not in codex.read_text()

    fresh = tmp_path / "fresh"
    code, out = invoke(fresh, "claude-code", "--write", "--no-telemetry")
    assert code == 0 and "OTEL" not in (fresh / ".claude" / "settings.json").read_text()
    code, out = invoke(fresh, "codex", "--write", "--no-telemetry")
    assert code == 0 and "otel" not in (fresh / ".codex" / "config.toml").read_text()


def test_codex_gets_an_otel_exporter_to_the_logs_url(tmp_path: Path) -> None:
    codex = tmp_path / ".codex" / "config.toml"
    codex.parent.mkdir()
    codex.write_text('# mine\nmodel = "gpt-5"\n\n[otel]\nlog_user_prompt = false\n')
    code, out = invoke(tmp_path, "codex", "--write")
    assert code == 0, out
    doc = tomllib.loads(codex.read_text())
    assert doc["otel"] == {"log_user_prompt": False, "exporter": {"otlp-http": {
        "endpoint": ENDPOINT + "/v1/logs", "protocol": "json",
        "headers": {"Authorization": f"Bearer {telemetry_token()}"}}}}
    assert codex.read_text().startswith('# mine\nmodel = "gpt-5"\n') and mode(codex) == 0o600
    code, out = invoke(tmp_path, "codex", "--write")
    assert out.splitlines()[-1] == f"{codex} already has this configuration: nothing written"
    moved = CliRunner().invoke(setup, ["codex", "--write", "--base-url", "http://127.0.0.1:9922"],
                               env={"HOME": str(tmp_path), "CODEX_HOME": None})
    assert moved.exit_code == 0, moved.output  # the proxy moved: its exporter replaced, once
    text = codex.read_text()
    assert text.count("[otel.exporter.otlp-http]") == 1 and "9911/_llmtap" not in text
    assert tomllib.loads(text)["otel"]["exporter"]["otlp-http"]["endpoint"] == "http://127.0.0.1:9922/_llmtap/otlp/v1/logs"


def test_gemini_cli_settings_carry_the_token_in_the_endpoint() -> None:
    t = Telemetry(URL, "llmtap-otlp-x")
    merged, note = gemini_merge({"general": {"x": 1}, "telemetry": {"logPrompts": True}}, t)
    assert note is None and merged == {"general": {"x": 1}, "telemetry": {
        "enabled": True, "target": "local", "otlpEndpoint": ENDPOINT + "/llmtap-otlp-x", "otlpProtocol": "http",
        "logPrompts": False}}
    kept, note = gemini_merge({"telemetry": {"enabled": True, "otlpEndpoint": "http://collector:4318"}}, t)
    assert kept == {"telemetry": {"enabled": True, "otlpEndpoint": "http://collector:4318"}} and note is not None


async def test_doctor_says_whether_each_tools_telemetry_reaches_llmtap(sim: Simulator, tmp_path: Path) -> None:
    home = tmp_path / "home"
    async with RunningProxy(proxy_config(sim.url, tmp_path)) as p:
        code, out = invoke(home, "claude-code", "--write")
        assert code == 0, out
        settings = home / ".claude" / "settings.json"
        data = json.loads(settings.read_text())
        data["env"]["OTEL_EXPORTER_OTLP_ENDPOINT"] = p.url + "/_llmtap/otlp"
        settings.write_text(json.dumps(data))
        live = LiveProxy(url=p.url, pid=None, db=None, admin_token=p.admin_token)
        env = {"HOME": str(home)}
        [before] = await asyncio.to_thread(telemetry_checks.telemetry, env, live)
        export = {"resourceLogs": [{"resource": {"attributes": [
            {"key": "service.name", "value": {"stringValue": "claude-code"}}]}, "scopeLogs": [{"logRecords": [
                {"timeUnixNano": str(time.time_ns()), "body": {"stringValue": "claude_code.user_prompt"},
                 "attributes": [{"key": "session.id", "value": {"stringValue": "s"}}]}]}]}]}
        async with aiohttp.ClientSession() as s:
            async with s.post(p.url + "/_llmtap/otlp/v1/logs", json=export,
                              headers={"Authorization": f"Bearer {telemetry_token()}"}) as r:
                assert r.status == 200
        [after] = await asyncio.to_thread(telemetry_checks.telemetry, env, live)
        settings.write_text(settings.read_text().replace(telemetry_token(), "llmtap-otlp-old"))
        [stale] = await asyncio.to_thread(telemetry_checks.telemetry, env, live)
    assert (before.status, before.detail) == ("WARN", "set up, but llmtap has received none of its events yet")
    assert after.status == "OK" and after.detail.startswith("reaches llmtap: 1 event(s), the newest "), after
    assert stale.status == "WARN" and "not llmtap's current one" in stale.detail
    assert telemetry_checks.telemetry({"HOME": str(tmp_path / "nobody")}, live) == []
