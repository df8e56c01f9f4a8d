"""Recorded metrics match what the simulated upstream was told to do."""

from __future__ import annotations

import time
from pathlib import Path

import aiohttp
import pytest
from multidict import CIMultiDict, CIMultiDictProxy

from proxy.meter.meter import Meter
from .serving import RunningProxy
from proxy.simulator.app import Simulator

from .conftest import proxy_config, rows

PROMPT = "x" * 400  # 100 input tokens by the simulator's count (characters / 4)

BODIES = {
    "/v1/chat/completions": {"model": "gpt-x", "stream": True, "stream_options": {"include_usage": True},
                             "messages": [{"role": "user", "content": PROMPT}]},
    "/v1/responses": {"model": "gpt-x", "stream": True, "input": PROMPT},
    "/v1/messages": {"model": "claude-x", "stream": True, "max_tokens": 100, "messages": [{"role": "user", "content": PROMPT}]},
}
DIALECTS = {"/v1/chat/completions": "openai_chat", "/v1/responses": "openai_responses", "/v1/messages": "anthropic"}


async def timed_stream(url: str, body: dict, headers: dict[str, str]) -> float:
    """Client-side end-to-end time in ms, reading every chunk as it arrives."""
    async with aiohttp.ClientSession() as s:
        t0 = time.perf_counter()
        async with s.post(url, json=body, headers=headers) as r:
            async for _ in r.content.iter_any():
                pass
        return (time.perf_counter() - t0) * 1000


@pytest.mark.parametrize("path", list(BODIES))
async def test_timing_and_tokens(sim: Simulator, proxy: RunningProxy, path: str) -> None:
    headers = {"x-sim-ttft-ms": "150", "x-sim-itl-ms": "20", "x-sim-tokens": "10", "x-sim-reasoning-tokens": "2",
               "x-sim-cache-read-tokens": "40", "x-sim-prefill-us-per-token": "0"}
    client_end = await timed_stream(proxy.url + path, BODIES[path], headers)
    row = rows(proxy)[0]
    assert row["dialect"] == DIALECTS[path] and row["outcome"] == "ok", row
    # Timing, by what must hold however busy the machine (the figures against the wire, to the
    # millisecond: benchmarks/wire_truth.py): the upstream waited 150 ms before its first token, the
    # proxy saw every piece before the client, and the row's figures are those of its chunks.
    chunks = rows(proxy, f"SELECT * FROM chunks WHERE request_id = '{row['id']}' ORDER BY seq")
    offsets = [c["offset_ms"] for c in chunks]
    gaps = [b - a for a, b in zip(offsets, offsets[1:], strict=False)]
    assert 150 <= row["ttft_ms"] == pytest.approx(offsets[0])
    assert row["proxy_overhead_ms"] <= row["ttft_ms"] - 150 + 1  # llmtap's own part of the wait
    assert row["upstream_headers_ms"] < row["ttft_ms"] <= row["last_token_ms"] <= row["e2e_ms"] <= client_end
    # 12 output tokens (2 reasoning + 10 text)
    assert row["output_tokens"] == 12 and row["tokens_source"] == "usage"
    assert row["reasoning_tokens"] == (None if path == "/v1/messages" else 2)  # Anthropic does not report it
    assert row["output_events"] == len(chunks) == 12
    assert row["tpot_ms"] == pytest.approx((offsets[-1] - offsets[0]) / 11) and row["tpot_ms"] > 0
    assert row["gap_max_ms"] == pytest.approx(max(gaps), abs=0.01) and min(gaps) >= 0
    assert row["gap_p50_ms"] == pytest.approx(sorted(gaps)[5], abs=0.01)  # the median of 11
    # the first text is the third event, after 2 reasoning tokens
    assert row["first_text_ms"] == pytest.approx(chunks[2]["offset_ms"]) and row["first_text_ms"] > row["ttft_ms"]
    assert row["cache_read_tokens"] == 40
    assert row["input_tokens"] >= 100  # includes cached input, by the GenAI conventions
    assert row["output_tokens_per_s"] == pytest.approx(12 * 1000 / row["e2e_ms"])
    assert [c["event_type"] for c in chunks] == ["reasoning"] * 2 + ["text"] * 10


async def test_request_columns(sim: Simulator, proxy: RunningProxy) -> None:
    body = {"model": "claude-x", "stream": True, "max_tokens": 77, "metadata": {"user_id": "u"},
            "messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]}
    headers = {"x-api-key": "sk-ant-api03-secret", "X-Claude-Code-Session-Id": "sess-1", "User-Agent": "claude-cli/2.1.197 (external, sdk-cli)"}
    await timed_stream(proxy.url + "/v1/messages?beta=true", body, headers)
    row = rows(proxy)[0]
    assert (row["request_model"], row["max_tokens"], row["message_count"], row["stream"]) == ("claude-x", 77, 3, True)
    assert row["session_id"] == "sess-1" and row["tool"] == "claude-code"
    assert row["path"] == "/v1/messages" and row["method"] == "POST" and row["route"] == "/"
    assert row["key_fingerprint"] and "secret" not in row["key_fingerprint"]
    assert row["upstream_host"] == "127.0.0.1" and row["started_at"].tzinfo is not None


async def test_estimated_tokens_without_usage(sim: Simulator, proxy: RunningProxy) -> None:
    body = {"model": "gpt-x", "stream": True, "messages": [{"role": "user", "content": "hi"}]}  # no include_usage
    await timed_stream(proxy.url + "/v1/chat/completions", body, {"x-sim-tokens": "6"})
    row = rows(proxy)[0]
    assert row["tokens_source"] == "estimated" and row["output_tokens"] >= 1 and row["output_events"] == 6


async def test_chunks_can_be_turned_off(sim: Simulator, tmp_path: Path) -> None:
    async with RunningProxy(proxy_config(sim.url, tmp_path, record_chunks=False)) as p:
        await timed_stream(p.url + "/v1/chat/completions", BODIES["/v1/chat/completions"], {})
        assert rows(p, "SELECT count(*) AS n FROM chunks")[0]["n"] == 0
        assert rows(p)[0]["output_events"] == 8


# -- a stream that never ends: per-request memory has a ceiling --------------------------------------


def test_a_meter_past_its_event_cap_keeps_running_figures_in_bounded_memory() -> None:
    """Three times MAX_EVENTS_KEPT events: the lists stay at the cap (give or take one batch of
    reads), the row's counts and times are exact, the gaps close, and the row says what was kept."""
    from proxy.meter.meter import MAX_EVENTS_KEPT, PENDING_READS
    from proxy.common.stats import quantile

    meter = Meter(received_ns=0, method="POST", path="/v1/chat/completions", query={},
                  headers=CIMultiDictProxy(CIMultiDict()), route="/", upstream_host="up", tag=None)
    meter.response_started(200, CIMultiDictProxy(CIMultiDict({"Content-Type": "text/event-stream"})), 1)
    event = b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
    total = 3 * MAX_EVENTS_KEPT
    times, t = [], 5_000_000
    for i in range(total):  # 1 ms gaps, every 50th 40 ms (2%), one of 777 ms well past the cap
        t += 777_000_000 if i == 2 * MAX_EVENTS_KEPT + 7 else 40_000_000 if i % 50 == 0 else 1_000_000 + i % 7
        times.append(t)
    for t in times:
        meter.on_chunk(event, t)
        assert len(meter.times) == len(meter.sizes) == len(meter.kinds) <= MAX_EVENTS_KEPT + PENDING_READS
    meter.on_chunk(b"data: [DONE]\n\n", times[-1] + 1)

    row, chunks = meter.finish(None, times[-1] + 1_000_000)
    assert len(meter.times) == len(meter.sizes) == len(meter.kinds) == MAX_EVENTS_KEPT
    assert row["output_events"] == total and row["outcome"] == "ok"
    assert row["ttft_ms"] == times[0] / 1e6 and row["last_token_ms"] == times[-1] / 1e6
    out = row["output_tokens"]
    assert out == total * 2 // 4 and row["tpot_ms"] == (row["last_token_ms"] - row["ttft_ms"]) / (out - 1)
    gaps = sorted(b - a for a, b in zip(times, times[1:]))
    assert row["gap_max_ms"] == gaps[-1] / 1e6 == 777
    for column, q in (("gap_p50_ms", 0.5), ("gap_p99_ms", 0.99)):
        exact = quantile(gaps, q) / 1e6  # type: ignore[operator]
        assert abs(row[column] - exact) <= exact / 32, (column, row[column], exact)
    assert row["parse_error"] == (f"over {MAX_EVENTS_KEPT} output events: chunk rows kept for the first "
                                  f"{MAX_EVENTS_KEPT} and the last; gap p50/p99 from a histogram (within 3%)")
    assert [c[1] for c in chunks] == [*range(MAX_EVENTS_KEPT), total - 1]
    assert chunks[0][2] == row["ttft_ms"] and chunks[-1][2] == row["last_token_ms"]
    assert all(c[3] == len(event) - 8 and c[4] == "text" for c in chunks)  # the payload, without "data: " and "\n\n"


async def test_a_stream_past_the_event_cap_leaves_its_row_and_the_capped_chunk_rows(
        sim: Simulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import proxy.meter.meter
    monkeypatch.setattr(proxy.meter.meter, "MAX_EVENTS_KEPT", 50)
    headers = {"x-sim-ttft-ms": "0", "x-sim-itl-ms": "0", "x-sim-tokens": "400", "x-sim-prefill-us-per-token": "0"}
    async with RunningProxy(proxy_config(sim.url, tmp_path)) as p:
        await timed_stream(p.url + "/v1/chat/completions", BODIES["/v1/chat/completions"], headers)
        (row,) = rows(p)
        chunks = rows(p, f"SELECT * FROM chunks WHERE request_id = '{row['id']}' ORDER BY seq")
    assert row["outcome"] == "ok" and row["output_events"] == 400 and row["output_tokens"] == 400
    assert row["parse_error"].startswith("over 50 output events: chunk rows kept for the first 50 and the last")
    assert [c["seq"] for c in chunks] == [*range(50), 399]
    assert chunks[0]["offset_ms"] == pytest.approx(row["ttft_ms"])
    assert chunks[-1]["offset_ms"] == pytest.approx(row["last_token_ms"])
    assert row["gap_max_ms"] is not None and row["tpot_ms"] is not None


def test_a_clock_pair_straddling_a_preemption_is_read_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """`started_at` and the kernel's stamps come from the two clocks read together (proxy/common/clocks.py):
    a pair whose monotonic reads lie 5 ms apart (the thread was preempted between them) is read again,
    and the tightest of the tries is kept when none is tight."""
    from proxy.common import clocks

    def reading(perf: list[int], wall: list[int]) -> tuple[int, int]:
        monkeypatch.setattr(clocks, "perf_counter_ns", iter(perf).__next__)
        monkeypatch.setattr(clocks, "time_ns", iter(wall).__next__)
        return clocks.pair()

    assert reading([0, 5_000_000, 5_000_010, 5_000_030], [1_000, 2_000]) == (5_000_020, 2_000)
    loose = [0, 5_000_000, 6_000_000, 6_100_000, 7_000_000, 9_000_000]  # 5 ms, 100 µs, 2 ms
    assert reading(loose, [1, 2, 3]) == (6_050_000, 2)
    monkeypatch.setattr(clocks, "perf_counter_ns", iter([3_000_000_000, 3_000_000_000]).__next__)
    monkeypatch.setattr(clocks, "time_ns", iter([1_764_547_200_000_000_000]).__next__)  # 2025-12-01 00:00 UTC
    # a moment 1.5 s before the pair, dated to the microsecond
    assert clocks.wall_of(1_500_000_000).isoformat() == "2025-11-30T23:59:58.500000+00:00"
