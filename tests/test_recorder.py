"""The recorder (proxy/record/recorder.py): every request's meter, the in-flight registry, rows built in
batches, and what each observer gets."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import duckdb
import orjson
from multidict import CIMultiDict, CIMultiDictProxy

from proxy.settings.config import ServeConfig
from proxy.meter.meter import Meter
from proxy.record.recorder import RECORD_BATCH, RECORD_BATCH_BYTES, RECORD_BATCH_EVENTS, RECORD_DELAY_S, Recorder
from .serving import RunningProxy
from proxy.simulator.app import Simulator

from .conftest import proxy_config
from .waiting import wait_until


def ended_meter(body: bytes = b"", events: int = 0) -> Meter:
    """A request that got a 200, as the relay's meter sees it: an empty JSON body, or `events` SSE events."""
    meter = Meter(received_ns=time.perf_counter_ns(), method="POST", path="/v1/chat/completions", query={},
                  headers=CIMultiDictProxy(CIMultiDict()), route="/", upstream_host="up", tag="batch")
    meter.request_body, meter.request_bytes = body, len(body)
    ctype = "text/event-stream" if events else "application/json"
    meter.response_started(200, CIMultiDictProxy(CIMultiDict({"Content-Type": ctype})), time.perf_counter_ns())
    event = b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
    for _ in range(events):
        meter.on_chunk(event, time.perf_counter_ns())
    meter.drain()
    return meter


def recording(tmp_path: Path) -> Recorder:
    config = ServeConfig(upstream="http://127.0.0.1:9", db=str(tmp_path / "x.duckdb"))
    return Recorder(config, report=print)


async def test_rows_are_built_in_batches_or_after_a_short_delay(tmp_path: Path) -> None:
    state = recording(tmp_path)
    seen: list[dict] = []
    state.observe(lambda finished: seen.append(finished.row))
    for _ in range(RECORD_BATCH - 1):
        state.end(ended_meter(), None, None)
    assert state.requests_seen == 0 and len(state.ended) == RECORD_BATCH - 1  # waiting for the batch
    state.end(ended_meter(), None, None)
    assert state.requests_seen == RECORD_BATCH and not state.ended  # a full batch is built at once
    state.end(ended_meter(), None, None)
    assert state.requests_seen == RECORD_BATCH
    # a lone request waits RECORD_DELAY_S for company, then its row is built alone
    await wait_until(lambda: state.requests_seen == RECORD_BATCH + 1, what="the lone request's row")
    assert not state.ended
    assert [r["outcome"] for r in seen] == ["ok"] * (RECORD_BATCH + 1) and all(r["e2e_ms"] < 1000 for r in seen)


async def test_a_batch_with_much_to_parse_is_built_at_once(tmp_path: Path) -> None:
    """Building a batch holds the event loop: big bodies or long streams do not wait for more."""
    state = recording(tmp_path)
    state.end(ended_meter(), None, None)
    assert state.requests_seen == 0
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * RECORD_BATCH_BYTES}]})
    state.end(ended_meter(body=body), None, None)
    assert state.requests_seen == 2 and not state.ended  # the waiting row too
    state.end(ended_meter(events=RECORD_BATCH_EVENTS // 2), None, None)
    assert state.requests_seen == 2
    state.end(ended_meter(events=RECORD_BATCH_EVENTS // 2), None, None)
    assert state.requests_seen == 4 and not state.ended
    await asyncio.sleep(RECORD_DELAY_S * 4)
    assert state.requests_seen == 4


async def test_a_stop_records_the_requests_still_waiting_for_their_row(sim: Simulator, tmp_path: Path) -> None:
    async with RunningProxy(proxy_config(sim.url, tmp_path)) as p:
        p.state.recorder.end(ended_meter(), None, None)
        assert p.state.requests_seen == 0  # no await since: its row waits for the batch or the delay
    con = duckdb.connect(str(tmp_path / "llmtap.duckdb"), read_only=True)
    assert con.execute("SELECT count(*), any_value(tag) FROM requests").fetchone() == (1, "batch")
