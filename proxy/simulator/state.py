"""What one simulator app keeps between requests."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from aiohttp import web

from proxy.simulator.config import SimConfig
from proxy.simulator.pacing import queue_load
from proxy.simulator.quota import Quotas

RecordedRequest = tuple[str, str, dict[str, str], bytes]


@dataclass(slots=True)
class SimState:
    """config may be replaced between requests; requests holds (method,
    path_qs, headers with lower-case names, raw body) when record is on."""

    config: SimConfig
    record: bool = True
    requests: list[RecordedRequest] = field(default_factory=list)
    active_streams: int = 0
    websockets: set[web.WebSocketResponse] = field(default_factory=set)
    quotas: Quotas = field(default_factory=Quotas)

    def load(self) -> float:
        return queue_load(self.active_streams, self.config.capacity)

    @contextmanager
    def generating(self) -> Iterator[None]:
        """Count one generation (streaming or not) as active while inside."""
        self.active_streams += 1
        try:
            yield
        finally:
            self.active_streams -= 1


STATE = web.AppKey("simulator_state", SimState)
