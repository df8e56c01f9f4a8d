"""How long a request's head may take, and how many connections are held at once.

- The head: a connection must complete a request's head within `--header-timeout` seconds of its
  opening or of its previous answer's end, or it is closed (nginx's `client_header_timeout`; a
  slow-header client held connections open for as long as it liked). It is aiohttp's keep-alive
  timer, which closes a connection still waiting for a complete head when it fires (and never one
  whose request is being answered: a stream runs as long as it runs), so an idle keep-alive
  connection closes after the same time.
- The count: past `--max-connections` open at once (made lower by the open-file limit: a relayed
  request holds up to three descriptors), a new connection is answered 503 in one write, in the
  APIs' error shape with `Retry-After`, and closed, before its request is read: nothing of it is
  relayed or recorded.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from aiohttp import web

RESERVED_FILES = 256  # descriptors kept for the database, the logs, the upstreams' DNS, ...
FILES_PER_CONNECTION = 3  # the client's socket, its duplicate for the kernel's stamp, the upstream's

_BODY = orjson.dumps({"error": {"type": "too_many_connections", "message": (
    "llmtap: too many connections open at once (serve --max-connections); try again shortly")}})
REFUSAL = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
           b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(_BODY)) + _BODY


def connection_cap(wanted: int) -> int:
    """`--max-connections`, lowered to what the open-file limit allows (that to 64 at least)."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError):
        return wanted
    if soft == resource.RLIM_INFINITY:
        return wanted
    return min(wanted, max(64, (soft - RESERVED_FILES) // FILES_PER_CONNECTION))


class _Refused(asyncio.Protocol):
    def connection_made(self, transport: Any) -> None:
        transport.write(REFUSAL)
        transport.close()


class Gate(web.Server):
    """aiohttp's server (the protocol factory of each connection), refusing past `max_connections`."""

    max_connections = 0  # 0: no cap

    def __call__(self) -> Any:
        if self.max_connections and len(self.connections) >= self.max_connections:  # public: a list a new connection
            return _Refused()
        return self.handler()

    def handler(self) -> web.RequestHandler:
        return super().__call__()
