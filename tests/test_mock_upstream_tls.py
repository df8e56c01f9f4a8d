"""`llmtap mock-upstream --tls` as a real process: the proxy trusts its CA through `ca_bundle`, a
new connection's `connect_ms` and `tls_ms` are recorded (0 on a reused one), and the relay passes
the https upstream's answer on as it came."""

from __future__ import annotations

import os
import re
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from proxy.serve.server import RunningProxy

from .conftest import proxy_config, rows
from .fast_path_skips import on
from .waiting import START_S, wait_until_sync

pytest.importorskip("trustme")

BODY = {"model": "m", "stream": True, "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]}
HEADERS = {"Authorization": "Bearer sk-test", "x-sim-echo-peer": "1"}
IDS = re.compile(rb"(msg|req|toolu)_[0-9A-Za-z]+")


@pytest.fixture
def tls_upstream(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """The simulator's own command line with --tls: its https URL and the CA file it wrote."""
    ca = tmp_path / "mock-ca.pem"
    proc = subprocess.Popen([sys.executable, "-m", "proxy", "mock-upstream", "--port", "0", "--tls",
                             "--tls-ca-file", str(ca), "--ttft-ms", "5", "--itl-ms", "1", "--tokens", "4",
                             "--prefill-us-per-token", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=dict(os.environ))
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.append(proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    try:
        line = wait_until_sync(lambda: lines and lines[0], START_S, "mock-upstream --tls listening")
        url = re.search(r"https://\S+", line)
        assert url is not None, line
        yield url.group(0), ca
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


async def fetch(s: aiohttp.ClientSession, url: str, ssl_context: ssl.SSLContext | bool = True) -> tuple:
    async with s.post(url + "/v1/messages", json=BODY, headers=HEADERS, ssl=ssl_context) as r:
        return r.status, r.headers.get("content-type"), r.headers.get("x-sim-peer"), await r.read()


async def test_an_https_mock_upstream_times_its_handshake_and_relays_as_is(
        tls_upstream: tuple[str, Path], tmp_path: Path) -> None:
    url, ca = tls_upstream
    assert ca.read_text().startswith("-----BEGIN CERTIFICATE-----")
    trusting = ssl.create_default_context(cafile=str(ca))
    async with aiohttp.ClientSession() as s:
        direct = await fetch(s, url, trusting)
    async with RunningProxy(proxy_config(url, tmp_path, ca_bundle=str(ca))) as p, aiohttp.ClientSession() as s:
        relayed = [await fetch(s, p.url) for _ in range(2)]
        first, second = rows(p)
    for answer in relayed:  # the same answer, byte for byte but for its generated ids
        assert answer[:2] == direct[:2] and answer[0] == 200 and answer[1].startswith("text/event-stream")
        assert IDS.sub(b"ID", answer[3]) == IDS.sub(b"ID", direct[3])
    assert relayed[0][2] is not None and relayed[0][2] == relayed[1][2]  # the upstream's header, one connection
    assert first["connection_reused"] is False and first["connect_ms"] is not None and first["connect_ms"] >= 0
    if on("conn_timing"):
        assert first["tls_ms"] is not None and first["tls_ms"] > 0
    else:  # the public path: the handshake is inside connect_ms
        assert first["tls_ms"] is None and first["connect_ms"] > 0
    assert second["connection_reused"] is True and second["connect_ms"] == 0 and second["tls_ms"] == 0
    parts = ("proxy_overhead_ms", "pool_wait_ms", "dns_ms", "connect_ms", "tls_ms", "upstream_wait_ms", "proxy_wait_ms")
    for row in (first, second):
        assert sum(row[name] or 0.0 for name in parts) == pytest.approx(row["upstream_headers_ms"], abs=1e-6)


@pytest.mark.parametrize("args, words", [
    (["--tls-cert", __file__], "--tls-cert and --tls-key go together"),
    (["--tls-ca-file", "ca.pem"], "--tls-ca-file goes with --tls"),
])
def test_tls_options_that_do_not_go_together(args: list[str], words: str) -> None:
    from click.testing import CliRunner

    from proxy.simulator.cli import mock_upstream

    result = CliRunner().invoke(mock_upstream, ["--port", "0", *args])
    assert result.exit_code == 2 and words in result.output


def test_a_pair_that_is_not_a_certificate_is_refused(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from proxy.simulator.cli import mock_upstream

    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    result = CliRunner().invoke(mock_upstream, ["--port", "0", "--tls-cert", str(junk), "--tls-key", str(junk)])
    assert result.exit_code == 1 and f"cannot load --tls-cert {junk}" in result.output
