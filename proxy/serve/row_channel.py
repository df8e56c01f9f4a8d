"""The private channel between `serve --workers N`'s primary and one of its workers.

A `socket.socketpair()` made by the primary, one end inherited by the worker it spawns (passed by
file descriptor, `pass_fds`): it has no name on any filesystem and no address, so no other process
can connect to it, another Unix user's least of all. Only these two processes hold its ends, and
both run llmtap's code as the same user: that is why its messages may be pickled (a finished
request's row holds datetimes and must reach the primary's observers exactly as the worker's
recorder built it).

A message is a 4-byte big-endian length and a pickle of a tuple whose first item is its kind:

- primary -> worker: `("init", {...})` (the configuration, the admin token, the client key, the
  port and addresses to listen on, the primary's private admin socket), `("stop",)`;
- worker -> primary: `("ready", {"pid": ...})`, `("rows", [(row, chunk rows, body row), ...])`,
  `("beat", {...})` (its health, every second), `("bye", {...})` (its last rows were sent).
"""

from __future__ import annotations

import asyncio
import pickle
import struct
from typing import Any

HEADER = struct.Struct("!I")
MAX_MESSAGE = 512 * 1024 * 1024  # a frame announcing more is a broken channel, not a message
READ_LIMIT = 1024 * 1024


def encode(message: tuple[Any, ...]) -> bytes:
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return HEADER.pack(len(payload)) + payload


async def receive(reader: asyncio.StreamReader) -> tuple[Any, ...] | None:
    """The next message, or None when the other end closed (or broke) the channel."""
    try:
        (size,) = HEADER.unpack(await reader.readexactly(HEADER.size))
        if size > MAX_MESSAGE:
            return None
        message = pickle.loads(await reader.readexactly(size))
    except (asyncio.IncompleteReadError, ConnectionError, OSError):
        return None
    return message if isinstance(message, tuple) and message else None


class Channel:
    """One end of the socketpair, on the running event loop."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, sock: Any) -> "Channel":
        reader, writer = await asyncio.open_unix_connection(sock=sock, limit=READ_LIMIT)
        return cls(reader, writer)

    def send(self, message: tuple[Any, ...]) -> bool:
        """Queue a message (never blocks); False when the channel is closed."""
        if self.writer.is_closing():
            return False
        try:
            self.writer.write(encode(message))
        except (ConnectionError, OSError, RuntimeError):
            return False
        return True

    def buffered(self) -> int:
        """Bytes written and not yet taken by the other end."""
        transport = self.writer.transport
        return transport.get_write_buffer_size() if transport is not None else 0

    async def drain(self) -> None:
        try:
            await self.writer.drain()
        except (ConnectionError, OSError, RuntimeError):
            pass

    async def receive(self) -> tuple[Any, ...] | None:
        return await receive(self.reader)

    async def close(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except (ConnectionError, OSError, RuntimeError):
            pass
