"""The process that decodes the agents' OTLP exports (proxy/relay/otlp.py), away from the event loop.

A protobuf parse holds the GIL for its whole length (some 15 ms for 3 MB), and OTLP/JSON's `json_format`
walks the message in Python (some 2 s of CPU for 4 MiB): in a thread, the event loop would wait for the
GIL meanwhile. In a process of its own, at a lower priority, it costs the relay nothing but a share of
a core the kernel gives the proxy first. Started on the first export, one export at a time; `pending` counts those read or decoded (the receiver bounds it).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from datetime import datetime
from typing import Any

from proxy.meter import agent_events

DECODER_NICE = 10  # the decoding process's nice value over the proxy's
ORPHAN_CHECK_S = 1.0


def _started(parent: int) -> None:
    """In the decoding process: a lower priority, and its end with the proxy's, however that ends (a
    SIGKILL included: its queue's pipe stays open in this process, so it would wait on it for ever)."""
    os.nice(DECODER_NICE)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(ORPHAN_CHECK_S)
        os._exit(0)

    threading.Thread(target=watch, name="llmtap-decoder-parent", daemon=True).start()


class Decoder:
    """One process, started on the first export, that decodes them one at a time (niced)."""

    def __init__(self) -> None:
        self._pool: ProcessPoolExecutor | None = None
        self.pending = 0  # exports being read or decoded

    async def decode(self, signal: str, body: bytes, limit: int, content_type: str | None, encoding: str | None,
                     received_at: datetime) -> list[tuple[Any, ...]]:
        """The export's `agent_events` rows (agent_events.decode, in the process); its ExportError;
        BrokenProcessPool if the process died (the next call starts another)."""
        loop = asyncio.get_running_loop()
        if self._pool is None:
            self._pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"),
                                             initializer=_started, initargs=(os.getpid(),))
        pool = self._pool
        # submitted from a thread: the first submit starts the process (a fork and exec), never on the loop
        future = await loop.run_in_executor(None, pool.submit, agent_events.decode, signal, body,
                                            content_type, encoding, limit, received_at)
        try:
            return await asyncio.wrap_future(future)
        except BrokenProcessPool:
            self._pool = None  # the next export starts a new one
            raise

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
