"""Admin SQL's own threads (`llmtap sql` while serving): a few, with a short queue, each query with
a timeout, stopped when its client leaves or the proxy stops.

A query never runs on the event loop's default executor: there, queries the clients had given up on
kept running, took every thread, and the shutdown's flush waited behind them (the stopped process
kept the database locked). Here, THREADS daemon threads run queries; QUEUE more wait; past that the
endpoint answers 503. A query is interrupted (DuckDB's `interrupt()`, query_limits.QueryStop) when its
timeout passes, when its client goes away (aiohttp cancels the handler), and at `close()`.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from proxy.record.query_limits import QueryStop, QueryStopped

THREADS = 2
QUEUE = 4  # queries waiting for a thread; one more is answered 503 busy
STOP_WAIT_S = 2.0  # how long an interrupted query is given to end before its answer goes out anyway
REINTERRUPT_S = 0.05  # a stopped query still running is interrupted again this often
JOIN_S = 5.0  # the longest a stop waits for the threads (AdminSql.join)

Job = tuple[Callable[[], Any], QueryStop, asyncio.AbstractEventLoop, "asyncio.Future[Any]"]


class Busy(Exception):
    pass


class Closed(Exception):
    pass


class AdminSql:
    def __init__(self, timeout_s: float, threads: int = THREADS, queue_limit: int = QUEUE) -> None:
        self.timeout_s = timeout_s
        self._limit = threads + queue_limit
        self._workers = threads
        self._jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._pending: set[QueryStop] = set()  # queued or running
        self._closed = False
        self._threads = [threading.Thread(target=self._work, name=f"llmtap-sql-{i}", daemon=True)
                         for i in range(threads)]
        self._stopping = threading.Event()  # some query was stopped: the reaper interrupts it until it ends
        self._threads.append(threading.Thread(target=self._reap, name="llmtap-sql-stop", daemon=True))
        for thread in self._threads:
            thread.start()

    async def run(self, fn: Callable[[QueryStop], Any]) -> Any:
        """fn(stop) in one of the threads; raises Busy, Closed, or QueryStopped (query_limits) past the timeout
        or when cancelled (the cancellation goes on after the query is interrupted)."""
        stop = QueryStop()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        with self._lock:
            if self._closed:
                raise Closed("llmtap is stopping")
            if len(self._pending) >= self._limit:
                raise Busy(f"llmtap is busy with {len(self._pending)} admin queries; try again when one ends")
            self._pending.add(stop)
        self._jobs.put((lambda: fn(stop), stop, loop, future))
        try:
            return await asyncio.wait_for(asyncio.shield(future), self.timeout_s)
        except asyncio.TimeoutError:
            self._stop(stop, f"the query was stopped after {self.timeout_s:g} s, the limit for a query through the "
                      "proxy (serve --sql-timeout)")
            return await _settle(future)
        except asyncio.CancelledError:
            self._stop(stop, "the client went away")
            future.add_done_callback(_consume)  # no one waits for its QueryStopped now
            raise

    def close(self) -> None:
        """Interrupt every query (queued ones do not start) and end the threads; never waits on them."""
        with self._lock:
            self._closed = True
            pending = list(self._pending)
        for stop in pending:
            self._stop(stop, "llmtap is stopping")
        for _ in range(self._workers):
            self._jobs.put(None)

    def join(self, timeout_s: float = JOIN_S) -> bool:
        """After `close`: wait up to `timeout_s` for the threads to end (a query interrupted by `close`
        ends within milliseconds). A thread still inside DuckDB when the interpreter exits would be
        ended in the middle of DuckDB's C++ (Python ends threads that wake after its finalization began),
        which aborts the process ("terminate called ...", SIGABRT) after every row was written.
        False if one is still running."""
        deadline = time.monotonic() + timeout_s
        self._stopping.set()  # the reaper sees the close and ends
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(thread.is_alive() for thread in self._threads)

    def _stop(self, stop: QueryStop, reason: str) -> None:
        stop.stop(reason)
        with self._lock:  # after the reason: the reaper, which clears it under the lock, sees one or the other
            self._stopping.set()

    def _reap(self) -> None:
        """Interrupt stopped queries again until they end (QueryStop.interrupt says why)."""
        while True:
            self._stopping.wait()
            with self._lock:
                stopped = [stop for stop in self._pending if stop.reason is not None]
                if not stopped and self._closed:
                    return
                if not stopped:
                    self._stopping.clear()
                    continue
            for stop in stopped:
                stop.interrupt()
            time.sleep(REINTERRUPT_S)

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            fn, stop, loop, future = job
            try:
                result: tuple[bool, Any] = (True, fn())
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting handler
                result = (False, exc)
            finally:
                with self._lock:
                    self._pending.discard(stop)
            try:
                loop.call_soon_threadsafe(_resolve, future, result)
            except RuntimeError:  # the loop is closed: no one waits
                pass


def _resolve(future: "asyncio.Future[Any]", result: tuple[bool, Any]) -> None:
    if future.done():
        return
    ok, value = result
    future.set_result(value) if ok else future.set_exception(value)


def _consume(future: "asyncio.Future[Any]") -> None:
    if not future.cancelled():
        future.exception()


async def _settle(future: "asyncio.Future[Any]") -> Any:
    """The interrupted query's own end (its QueryStopped), or, if it does not end soon, a stand-in."""
    try:
        return await asyncio.wait_for(asyncio.shield(future), STOP_WAIT_S)
    except asyncio.TimeoutError:
        future.add_done_callback(_consume)
        raise QueryStopped("the query was stopped (its time was up) and is still ending") from None
    except asyncio.CancelledError:
        future.add_done_callback(_consume)
        raise
