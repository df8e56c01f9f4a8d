"""The running `llmtap top`: follow the feed into the model, redraw every interval, quit on q.

`follow` keeps one connection to the proxy's live feed and reconnects when
it drops; on each connection's first tick it backfills the window from the
proxy's database (the ids make overlaps harmless). `live` draws until q,
Ctrl-C, Ctrl-D or SIGTERM; `once` returns a single frame.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
from contextlib import aclosing, suppress

import aiohttp

from analysis.top.feed import FeedError, Proxy, backfill, ticks
from analysis.top.model import TopModel
from analysis.top.render import Line, frame
from analysis.top.terminal import Terminal

RETRY_S = 1.0
QUIT_KEYS = (b"q", b"Q", b"\x03", b"\x04")  # q, Ctrl-C, Ctrl-D


class Link:
    """The connection's state, for the title line."""

    def __init__(self) -> None:
        self.status: str | None = "connecting"


async def follow(session: aiohttp.ClientSession, proxy: Proxy, model: TopModel, link: Link) -> None:
    """Apply the feed's ticks to `model` until cancelled, reconnecting after a drop."""
    while True:
        try:
            await _connection(session, proxy, model, link)
            link.status = "the proxy closed the feed; reconnecting"
        except FeedError as exc:
            link.status = str(exc)
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as exc:
            link.status = f"disconnected ({type(exc).__name__}); reconnecting"
        model.disconnected()
        await asyncio.sleep(RETRY_S)


async def _connection(session: aiohttp.ClientSession, proxy: Proxy, model: TopModel, link: Link) -> None:
    first = True
    async with aclosing(ticks(session, proxy)) as feed:
        async for tick in feed:
            if first:
                model.add_finished(await backfill(session, proxy, model.window_s))
                first = False
                link.status = None
            model.apply(tick)


def _label(proxy: Proxy) -> str:
    return proxy.url.removeprefix("http://").removeprefix("https://")


def _size() -> tuple[int, int]:
    size = shutil.get_terminal_size()
    return size.columns, size.lines


async def once(proxy: Proxy, window_s: float, kinds: tuple[str, ...] = ("generation",),
               bench: bool = False) -> list[Line]:
    """One frame from the first tick (and the backfilled window)."""
    model = TopModel(window_s, kinds=kinds, bench=bench)
    async with aiohttp.ClientSession() as session:
        try:
            async with aclosing(ticks(session, proxy)) as feed:
                async for tick in feed:
                    model.add_finished(await backfill(session, proxy, window_s))
                    model.apply(tick)
                    break
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            raise FeedError(f"cannot reach llmtap serve at {proxy.url}: {exc}") from None
    if model.ticks == 0:
        raise FeedError(f"{proxy.url} closed the live feed before its first tick")
    width, height = _size()
    return frame(model, width, height, _label(proxy))


async def live(proxy: Proxy, window_s: float, interval_s: float, kinds: tuple[str, ...] = ("generation",),
               bench: bool = False) -> None:
    """Redraw every `interval_s` until q, Ctrl-C, Ctrl-D or SIGTERM; the terminal is restored after."""
    model, link = TopModel(window_s, kinds=kinds, bench=bench), Link()
    quit_, wake = asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, quit_.set)
    with suppress(NotImplementedError, AttributeError):
        loop.add_signal_handler(signal.SIGWINCH, wake.set)

    def on_key(data: bytes) -> None:
        if any(key in data for key in QUIT_KEYS):
            quit_.set()
        wake.set()

    async with aiohttp.ClientSession() as session:
        feeder = asyncio.create_task(follow(session, proxy, model, link))
        try:
            with Terminal(on_key) as term:
                while not quit_.is_set():
                    width, height = _size()
                    term.draw(frame(model, width, height, _label(proxy), link.status))
                    with suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(wake.wait(), interval_s)
                    wake.clear()
        finally:
            feeder.cancel()
            await asyncio.gather(feeder, return_exceptions=True)
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
