"""A fresh connection's cost, for a simulated slower channel (`SimConfig.connect_delay_ms`).

The kernel completes a TCP handshake before the server accepts the connection, so a server cannot
slow the handshake itself. `SlowStart` is a TCP front on the simulator's public port: it holds each
new connection `delay_s` before it passes the client's first bytes on to the simulator's own
server (on a loopback port of its own), then relays bytes both ways as they come. For an https
simulator the hold falls inside the TLS handshake (the ClientHello waits), as a far TLS terminator
or a corporate proxy's tunnel would cost; for http, before the first response on the connection.
Later requests on the same connection pay nothing: only new connections do.
"""

from __future__ import annotations

import asyncio
import contextlib

READ = 64 * 1024


class SlowStart:
    def __init__(self, delay_s: float, target_host: str, target_port: int) -> None:
        self.delay_s = delay_s
        self.target = (target_host, target_port)
        self._server: asyncio.Server | None = None
        self.connections = 0  # accepted so far
        self._tasks: set[asyncio.Task[None]] = set()  # kept referenced until they end

    async def start(self, host: str, port: int) -> int:
        """Listen on host:port (0: any free port); returns the port."""
        self._server = await asyncio.start_server(self._accepted, host, port)
        return self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None

    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.connections += 1
        try:
            await asyncio.sleep(self.delay_s)
            try:
                inner_reader, inner_writer = await asyncio.open_connection(*self.target)
            except OSError:
                writer.transport.abort()
                return
            pipes = [asyncio.ensure_future(_pipe(reader, inner_writer)),
                     asyncio.ensure_future(_pipe(inner_reader, writer))]
            try:
                await asyncio.gather(*pipes)
            except BaseException:  # a reset on one side, or closing: cut both
                for pipe in pipes:
                    pipe.cancel()
                inner_writer.transport.abort()
                writer.transport.abort()
                raise
            inner_writer.close()
            writer.close()
        except (ConnectionError, OSError):
            pass
        except asyncio.CancelledError:  # close(): asyncio's server callback would log a cancelled task
            pass
        finally:
            if not writer.transport.is_closing():  # cancelled while holding the connection
                writer.transport.abort()
            self._tasks.discard(task)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Bytes from `reader` to `writer` until EOF (then half-closes `writer`); a reset ends both ways."""
    try:
        while data := await reader.read(READ):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        writer.transport.abort()
        raise
