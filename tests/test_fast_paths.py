"""proxy/relay/fast_paths.py: a fast path runs only on the aiohttp shape it was written for; elsewhere, or
with LLMTAP_FAST_PATHS=off, the public path relays the same bytes and leaves the same rows."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from aiohttp.streams import StreamReader
from aiohttp.web_protocol import RequestHandler

from proxy.relay import body_pipe, fast_paths
from proxy.settings.config import ConfigError
from .serving import RunningProxy

from .conftest import proxy_config, rows
from .faultkit import SSE, RawConn, RawUpstream, chunk, http_head
from .waiting import START_S, wait_until

CHAT = "/v1/chat/completions"
EVENTS = [b'data: {"choices":[{"index":0,"delta":{"content":"t%d"}}]}\n\n' % i for i in range(40)] + [b"data: [DONE]\n\n"]
TESTED = aiohttp.__version__ == ".".join(map(str, fast_paths.NEWEST))


@pytest.mark.skipif(not TESTED, reason="the installed aiohttp is not the one the fast paths were last tested on")
def test_the_tested_aiohttp_fits_every_fast_path() -> None:
    assert fast_paths.shapes() == ()
    assert fast_paths.probe({}).summary()["on"] == list(fast_paths.NAMES)


def test_a_reader_missing_a_field_is_refused() -> None:
    class Reader:  # aiohttp's fields but one, as a reader with chunk tracing would differ by one
        __slots__ = fast_paths.READER_SLOTS[:-1]

    assert "fields" in (fast_paths.body_pipe_shape(reader=Reader) or "")


def test_a_reader_whose_feed_data_takes_other_arguments_is_refused() -> None:
    methods = {name: getattr(StreamReader, name) for name in fast_paths.READER_METHODS}
    Reader = type("Reader", (), {"__slots__": fast_paths.READER_SLOTS, **methods,
                                 "feed_data": lambda self, data, size, *, trace: True})
    assert fast_paths.body_pipe_shape(reader=Reader) == \
        "Reader.feed_data takes (self, data, size, trace), not (self, data, size=0)"


def test_a_handler_or_server_shaped_otherwise_is_refused() -> None:
    class Handler(RequestHandler):  # no __slots__ of its own: the inherited ones count
        pass

    assert fast_paths.arrival_shape(handler=Handler) is None

    class Bare(asyncio.Protocol):
        __slots__ = ("_request_count", "_payload_parser", "_upgraded", "_reading_paused", "_buffer_paused")

        def data_received(self, data: bytes) -> None:
            pass

    assert fast_paths.arrival_shape(handler=Bare) == "Bare has no _messages"

    class Server:
        def __init__(self, handler: object, *, loop: object = None, **kwargs: object) -> None:
            self.loop, self.kwargs = loop, kwargs

    assert "_loop and _kwargs" in (fast_paths.arrival_shape(server=Server) or "")


def test_headers_sent_otherwise_are_refused() -> None:
    class Response(web.StreamResponse):
        pass

    assert fast_paths.headers_later_shape(response=Response) is not None
    assert fast_paths.headers_later_shape() is None


@pytest.mark.parametrize("version, refused", [
    ("3.14.5", False), ("3.14.0", False), ("3.14.6", True), ("3.15.0", True), ("4.0.0", True),
    ("3.15.0a1", True), ("3.14.5.dev0", True), ("3.13.3", True),
])
def test_only_tested_releases(version: str, refused: bool) -> None:
    assert (fast_paths.version_refusal(version) is not None) is refused


def test_the_variable() -> None:
    assert fast_paths.forced_off("") == fast_paths.forced_off("on") == ()
    assert fast_paths.forced_off("OFF") == fast_paths.NAMES
    assert fast_paths.forced_off("off:arrival, body_pipe") == ("arrival", "body_pipe")
    for wrong in ("no", "off:", "off:pipe"):
        with pytest.raises(ValueError, match="LLMTAP_FAST_PATHS"):
            fast_paths.forced_off(wrong)


def test_serve_refuses_a_variable_it_does_not_understand(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(fast_paths.ENV, "of")
    with pytest.raises(ConfigError, match="LLMTAP_FAST_PATHS is on, off or off:"):
        RunningProxy(proxy_config("http://127.0.0.1:9", tmp_path))


async def _relay_while_watching(tmp_path: Path) -> tuple[bytes, dict, int, dict]:
    """A stream, half of it sent, then held until the test has looked at the body pipes in use:
    (the body the client got, its row, how many pipes ran mid-stream, the proxy's health)."""
    half = asyncio.Event()
    go_on = asyncio.Event()

    async def held(conn: RawConn) -> None:
        await conn.read_request()
        await conn.send(http_head(200, SSE, chunked=True))
        for i, event in enumerate(EVENTS):
            if i == len(EVENTS) // 2:
                half.set()
                await go_on.wait()
            await conn.send(chunk(event))
        await conn.send(b"0\r\n\r\n")

    async with RawUpstream(held) as up, RunningProxy(proxy_config(up.url, tmp_path)) as p:
        async with aiohttp.ClientSession() as s, asyncio.timeout(20):
            async with s.post(p.url + CHAT, json={"model": "m", "stream": True}) as r:
                await half.wait()
                got = bytearray(await r.content.readexactly(sum(map(len, EVENTS[:len(EVENTS) // 2]))))
                piped = len(body_pipe.PIPES)
                go_on.set()
                got += await r.read()
        async with aiohttp.ClientSession() as s, s.get(p.url + "/_llmtap/health", headers=p.admin.headers()) as r:
            health = await r.json()
        assert p.flush(10)
        row = rows(p)[0]
    return bytes(got), row, piped, health["fast_paths"]


async def test_forced_off_the_public_path_relays_byte_for_byte(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(fast_paths.ENV, "off")
    body, row, piped, health = await _relay_while_watching(tmp_path)
    assert piped == 0  # no body pipe: readany and write
    assert body == b"".join(EVENTS)
    assert row["outcome"] == "ok" and row["output_events"] == len(EVENTS) - 1
    assert row["ttft_ms"] is not None and row["ttft_ms"] <= row["e2e_ms"]
    assert health["on"] == [] and set(health["off"]) == set(fast_paths.NAMES)
    assert health["off"]["body_pipe"] == "turned off (LLMTAP_FAST_PATHS)"


@pytest.mark.skipif(not TESTED, reason="the installed aiohttp is not the one the fast paths were last tested on")
async def test_by_default_the_body_pipe_relays_and_health_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(fast_paths.ENV, raising=False)
    body, row, piped, health = await _relay_while_watching(tmp_path)
    assert piped == 1
    assert body == b"".join(EVENTS) and row["outcome"] == "ok"
    assert health == {"aiohttp": aiohttp.__version__, "on": list(fast_paths.NAMES), "off": {},
                      "kernel_stamps": ["arrival", "upstream", "tls_flight"]}


async def test_health_names_the_one_path_turned_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(fast_paths.ENV, "off:conn_timing")
    async with RunningProxy(proxy_config("http://127.0.0.1:9", tmp_path)) as p:
        assert p.state.session.connector.hooked is False  # type: ignore[attr-defined]
        async with aiohttp.ClientSession() as s, s.get(p.url + "/_llmtap/health", headers=p.admin.headers()) as r:
            health = await r.json()
    assert "conn_timing" in health["fast_paths"]["off"]
    assert "conn_timing" not in health["fast_paths"]["on"]


async def test_doctor_says_which_paths_are_off_and_why(tmp_path: Path) -> None:
    from .test_run import clean_env, llmtap

    env = {**clean_env(tmp_path), fast_paths.ENV: "off:body_pipe"}
    code, out, err = await llmtap("doctor", "--upstream", "http://127.0.0.1:9", env=env)
    line = next(line for line in out.splitlines() if " fast paths: " in line)
    assert line == (f"OK    fast paths: arrival, headers_later, conn_timing, kernel_stamps on in llmtap serve here (aiohttp "
                    f"{aiohttp.__version__}); off, the public path runs (slower, as correct): body_pipe: turned off "
                    "(LLMTAP_FAST_PATHS)") or not TESTED


def test_the_package_bound_and_the_probes_agree() -> None:
    """pyproject.toml's floor is the probe's OLDEST, and the tested release lies inside its range."""
    import re
    import tomllib

    deps = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())["project"]["dependencies"]
    (spec,) = [d for d in deps if d.startswith("aiohttp")]
    major, minor, cap = re.fullmatch(r"aiohttp>=(\d+)\.(\d+),<=([\d.]+)", spec).groups()  # type: ignore[union-attr]
    assert (int(major), int(minor), 0) == fast_paths.OLDEST
    assert fast_paths.OLDEST <= fast_paths.NEWEST <= tuple(map(int, cap.split(".")))  # the lock's release


def test_serve_names_a_path_the_probe_refused() -> None:
    assert fast_paths.FastPaths("3.14.5").refusal_note() is None
    assert fast_paths.FastPaths("3.14.5", {"arrival": "turned off (LLMTAP_FAST_PATHS)"}).refusal_note() is None
    assert fast_paths.FastPaths("3.14.5", {"kernel_stamps": "not Linux: no SO_TIMESTAMPNS (this system)"}).refusal_note() is None
    refused = {n: "aiohttp 3.15.0 is newer than 3.14.5, the last release these internals were tested on"
               for n in fast_paths.NAMES}
    assert fast_paths.FastPaths("3.15.0", refused).refusal_note() == (
        "llmtap: aiohttp 3.15.0: body_pipe, arrival, headers_later, conn_timing, kernel_stamps on the public path (slower, as "
        "correct): aiohttp 3.15.0 is newer than 3.14.5, the last release these internals were tested on "
        "(llmtap doctor says more)")


def sockets_open_twice() -> set[str]:
    """The sockets this process holds under two descriptors or more: the duplicates kernel_timing.py
    reads a connection by, behind the loop's back."""
    seen: Counter[str] = Counter()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            if (link := os.readlink(f"/proc/self/fd/{fd}")).startswith("socket:"):
                seen[link] += 1
    return {link for link, n in seen.items() if n > 1}


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/self/fd")
@pytest.mark.parametrize("switch", ["off", "off:kernel_stamps", "on"])
async def test_off_no_connection_is_read_behind_the_loops_back(switch: str, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """While a request waits for its upstream's headers, with kernel stamps off, no socket of the
    proxy has a second descriptor (by default both legs have one: the check can see them)."""
    if switch == "on" and not fast_paths.probe({}).on("kernel_stamps"):
        pytest.skip(f"kernel stamps are off here: {fast_paths.probe({}).refused['kernel_stamps']}")
    monkeypatch.setenv(fast_paths.ENV, switch)
    go_on = asyncio.Event()

    async def held(conn: RawConn) -> None:
        await conn.read_request()
        await go_on.wait()
        await conn.send(http_head(200, {"Content-Type": "application/json"}, length=2) + b"{}")

    before = sockets_open_twice()
    async with RawUpstream(held) as up, RunningProxy(proxy_config(up.url, tmp_path)) as p, \
            aiohttp.ClientSession() as s:
        sent = asyncio.ensure_future(s.post(p.url + CHAT, json={"model": "m"}))
        await wait_until(lambda: up.requests, what="the request upstream")
        doubled = sockets_open_twice() - before
        go_on.set()
        async with await sent as r:
            assert await r.read() == b"{}"
        async with s.get(p.url + "/_llmtap/health", headers=p.admin.headers()) as r:
            health = (await r.json())["fast_paths"]
    if switch == "on":
        assert len(doubled) == 2, doubled  # the upstream connection's answer, the client's next request
        assert health["kernel_stamps"] == ["arrival", "upstream", "tls_flight"]
    else:
        assert doubled == set()
        assert health["kernel_stamps"] == [] and "kernel_stamps" in health["off"]


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/self/fd")
def test_the_kernel_probe_runs_when_serve_starts_and_never_when_turned_off() -> None:
    """Importing llmtap opens no socket; the probe with kernel stamps off opens none either; on, it
    keeps the one socket that asks the kernel to stamp what it receives."""
    code = """if True:
        import os
        def sockets():
            return sum(os.readlink(f"/proc/self/fd/{fd}").startswith("socket:") for fd in os.listdir("/proc/self/fd")
                       if os.path.exists(f"/proc/self/fd/{fd}"))
        import proxy.cli, proxy.serve.server, proxy.relay.app, proxy.relay.arrival
        from proxy.relay import fast_paths
        imported = sockets()
        off = fast_paths.probe({"LLMTAP_FAST_PATHS": "off"})
        after_off = sockets()
        on = fast_paths.probe({})
        print(imported, after_off, sockets(), int(on.on("kernel_stamps")))
    """
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=START_S)
    assert done.returncode == 0, done.stderr
    imported, after_off, after_on, kernel = map(int, done.stdout.split())
    assert after_off == imported
    assert after_on == imported + kernel
