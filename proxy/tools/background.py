"""The proxy on its own event loop in a background thread, for `llmtap run`."""

from __future__ import annotations

import asyncio
import threading
from typing import Callable

from proxy.settings.config import ServeConfig
from proxy.common.terminal_text import stderr_line
from proxy.serve.server import RunningProxy


class BackgroundProxy:
    """`with BackgroundProxy(config) as proxy:` serves on `proxy.url` until the block ends.

    Leaving the block stops the server and closes the store, so every row of
    the requests it relayed is written when it returns.
    """

    def __init__(self, config: ServeConfig, report: Callable[[str], None] = stderr_line) -> None:
        self.config = config
        self.report = report
        self.proxy: RunningProxy | None = None
        self._error: BaseException | None = None
        self._started = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._main, name="llmtap-run-proxy", daemon=True)

    @property
    def url(self) -> str:
        assert self.proxy is not None
        return self.proxy.url

    def __enter__(self) -> "BackgroundProxy":
        return self.start()

    def start(self) -> "BackgroundProxy":
        """Serve; raises what stopped the proxy from starting (OSError for a port in use)."""
        self._thread.start()
        if not self._started.wait(30):
            raise RuntimeError("the proxy did not start within 30 s")
        if self._error is not None:
            self._thread.join(10)
            raise self._error
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self, timeout: float = 30) -> None:
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout)

    def _main(self) -> None:
        try:
            import uvloop
        except ImportError:  # pragma: no cover
            asyncio.run(self._serve())
        else:
            uvloop.run(self._serve())

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        try:
            async with RunningProxy(self.config, report=self.report) as proxy:
                self.proxy = proxy
                self._started.set()
                await self._stop.wait()
        except BaseException as exc:  # startup errors go to the caller's thread
            if not self._started.is_set():
                self._error = exc
            else:
                self.report(f"llmtap: the proxy stopped with an error: {type(exc).__name__}: {exc}")
        finally:
            self._started.set()
