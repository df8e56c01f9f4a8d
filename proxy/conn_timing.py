"""Where a request's wait for its upstream connection goes, from aiohttp's own signals.

One `ConnectionMarks` per relayed request (the meter's, proxy/meter.py) rides along as
aiohttp's `trace_request_ctx`; the signals of the one `TraceConfig` the upstream session carries
stamp it with the monotonic clock, at the moments they mark:

- `on_connection_reuseconn`: a pooled connection was taken (`ready`, `reused`);
- `on_connection_create_start`: no pooled connection, a new one is opened (`start`);
- `on_dns_resolvehost_end`: the host was resolved (none for an IP address or a cached name);
- the connector's protocol factory, which asyncio (and uvloop) call once the TCP connection is
  up and before the TLS handshake (`tcp_end`; through a forward proxy, the last call: after the
  CONNECT tunnel, before TLS to the upstream);
- `on_connection_create_end`: the new connection is ready, TLS included (`ready`).

A request fires one signal on a pooled connection and two or three on a new one: nothing per
chunk, nothing per byte. The marks become `pool_wait_ms`, `dns_ms`, `connect_ms`, `tls_ms` and
`upstream_wait_ms` (`ConnectionMarks.parts`); docs/breakdown-and-compare.md defines them.
"""

from __future__ import annotations

from contextvars import ContextVar
from time import perf_counter_ns
from types import SimpleNamespace
from typing import Any, Callable

import aiohttp

from .meter import ConnectionMarks

# The marks of the connection being opened by the current task, for the protocol factory (which
# aiohttp calls with no arguments): set at create_start, cleared at create_end.
_OPENING: ContextVar[ConnectionMarks | None] = ContextVar("llmtap_opening", default=None)


async def _create_start(session: Any, ctx: SimpleNamespace, params: Any) -> None:
    marks = ctx.trace_request_ctx
    if marks is not None:
        marks.start, marks.reused = perf_counter_ns(), False
        marks.dns_end = marks.tcp_end = marks.ready = None  # a retry on a new connection starts over
        _OPENING.set(marks)


async def _dns_end(session: Any, ctx: SimpleNamespace, params: Any) -> None:
    marks = ctx.trace_request_ctx
    if marks is not None:
        marks.dns_end = perf_counter_ns()


async def _create_end(session: Any, ctx: SimpleNamespace, params: Any) -> None:
    marks = ctx.trace_request_ctx
    if marks is not None:
        marks.ready = perf_counter_ns()
        _OPENING.set(None)


async def _reused(session: Any, ctx: SimpleNamespace, params: Any) -> None:
    marks = ctx.trace_request_ctx
    if marks is not None:
        marks.ready, marks.reused = perf_counter_ns(), True


def trace_config() -> aiohttp.TraceConfig:
    """The upstream session's TraceConfig (made once per session; aiohttp freezes it)."""
    config = aiohttp.TraceConfig()
    config.on_connection_create_start.append(_create_start)
    config.on_dns_resolvehost_end.append(_dns_end)
    config.on_connection_create_end.append(_create_end)
    config.on_connection_reuseconn.append(_reused)
    return config


def time_tcp_connects(connector: aiohttp.BaseConnector) -> bool:
    """Stamp `tcp_end` when the connector makes a connection's protocol: between the TCP connect
    and the TLS handshake. aiohttp has no signal there, so this wraps the connector's protocol
    factory (`_factory`, an attribute of every aiohttp 3.x connector); where it is missing, nothing
    changes and a TLS handshake counts in `connect_ms` (`tls_ms` NULL). Returns whether it could."""
    factory: Callable[[], Any] | None = getattr(connector, "_factory", None)
    if not callable(factory):
        return False

    def timed_factory() -> Any:
        marks = _OPENING.get()
        if marks is not None:
            marks.tcp_end = perf_counter_ns()
        return factory()

    connector._factory = timed_factory  # type: ignore[attr-defined]
    return True
