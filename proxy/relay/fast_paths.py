"""Which of llmtap's fast paths run: each uses aiohttp internals, so each is on only where a start-up
probe finds the shape it was written for, on an aiohttp release it was tested with.

| path | what it does | its public path (slower, as correct) |
|---|---|---|
| `body_pipe` | a response body from the upstream parser's `feed_data` straight to the client's transport (body_pipe.py) | `readany()` and `StreamResponse.write()`, a task wake-up per piece; each piece stamped when the task has it |
| `arrival` | a request's arrival stamped at the read of its first byte (arrival.py) | the handler's start: after the request's headers are parsed |
| `headers_later` | a whole answer's headers and body leave in one write (reverse.py `_Answer`) | the headers in their own write, at `prepare()` |
| `conn_timing` | `tcp_end` stamped between the TCP connect and the TLS handshake (conn_timing.py: the connector's `_factory`) | the handshake counts in `connect_ms`, `tls_ms` is NULL |
| `kernel_stamps` | the kernel's times (kernel_timing.py, Linux): a connection's next bytes read by llmtap with their receive stamp, aiohttp's flow-control flags read, TCP_INFO | each moment is that of the loop's read; llmtap's own waits stay in the network's and upstream's parts |

A path is refused (the public one runs) when aiohttp is outside `OLDEST`..`NEWEST` (`NEWEST` is the
release the fast paths were last tested with: `.ci/run` runs the stream tests with them on and off),
when a class it touches is not shaped as it was there (slots, method signatures, attributes), for
`kernel_stamps` where the kernel gives no receive stamp (not Linux), or when `LLMTAP_FAST_PATHS` turns
it off: `off` for all, `off:body_pipe,arrival` for some. The probe runs when serve starts (`probe`).
Health (`/_llmtap/health`) and `llmtap doctor` say which are on and why the others are not.
docs/development.md lists every private name and what to run before raising `NEWEST`.
"""

from __future__ import annotations

import inspect
import os
import re
from dataclasses import dataclass, field
from functools import cache
from typing import Any, Callable, Mapping

import aiohttp
from aiohttp import web

from proxy.relay import kernel_timing

ENV = "LLMTAP_FAST_PATHS"
SYSTEM = "this system"  # the end of a refusal that no aiohttp release changes (kernel_stamps off macOS)
NAMES = ("body_pipe", "arrival", "headers_later", "conn_timing", "kernel_stamps")
OLDEST, NEWEST = (3, 14, 0), (3, 14, 5)  # pyproject.toml's floor; the last release tested

# StreamReader's fields in aiohttp 3.14.5: `_PipedReader` takes the reader's place with these.
READER_SLOTS = (
    "_protocol", "_low_water", "_high_water", "_low_water_chunks", "_high_water_chunks", "_loop", "_size",
    "_cursor", "_http_chunk_splits", "_buffer", "_buffer_offset", "_eof", "_waiter", "_eof_waiter",
    "_exception", "_timer", "_eof_callbacks", "_eof_counter", "total_bytes", "total_compressed_bytes",
)
# The methods each path overrides or calls, and their parameters there.
READER_METHODS = {
    "feed_data": "self, data, size=0", "begin_http_chunk_receiving": "self", "end_http_chunk_receiving": "self",
    "read_nowait": "self, n=-1", "wait_eof": "self", "exception": "self", "is_eof": "self",
    "set_exception": "self, exc, exc_cause=<sentinel>",
}
HANDLER_FIELDS = ("_messages", "_request_count", "_payload_parser", "_upgraded")


@dataclass(frozen=True)
class FastPaths:
    """The fast paths of this process: `refused` says why each one that is off is off."""

    aiohttp: str
    refused: Mapping[str, str] = field(default_factory=dict)

    def on(self, name: str) -> bool:
        return name not in self.refused

    def refusal_note(self) -> str | None:
        """serve's start-up line when the probe turned a path off for this aiohttp (not one turned off
        by LLMTAP_FAST_PATHS, nor kernel stamps on a system without them)."""
        refused = [name for name, why in self.refused.items() if not expected(why)]
        if not refused:
            return None
        return (f"llmtap: aiohttp {self.aiohttp}: {', '.join(refused)} on the public path (slower, as correct): "
                f"{self.refused[refused[0]]} (llmtap doctor says more)")

    def summary(self, hooked: bool | None = None) -> dict[str, Any]:
        """For health and doctor: `hooked` is the upstream connector's own answer (conn_timing's
        `TimedConnector.hooked`; None: no connector to ask)."""
        refused = dict(self.refused)
        if hooked is False and "conn_timing" not in refused:
            refused["conn_timing"] = "the upstream connector has no _factory to hook, or does not time connections"
        return {"aiohttp": self.aiohttp, "on": [n for n in NAMES if n not in refused],
                "off": {n: refused[n] for n in NAMES if n in refused}}


def probe(env: Mapping[str, str] = os.environ) -> FastPaths:
    """This process's fast paths: the shapes (probed once), the kernel's stamps (tried once, unless
    turned off: trying them turns them on for the machine) and `LLMTAP_FAST_PATHS` (ValueError when
    it names no path)."""
    refused = dict(shapes())
    for name in forced_off(env.get(ENV, "")):
        refused[name] = f"turned off ({ENV})"
    if "kernel_stamps" not in refused and (why := kernel_timing.refusal()) is not None:
        refused["kernel_stamps"] = f"{why} ({SYSTEM})"
    return FastPaths(aiohttp.__version__, refused)


def expected(why: str) -> bool:
    """A path turned off by `LLMTAP_FAST_PATHS` or one this system lacks: nothing to warn about."""
    return why.endswith((f"({ENV})", f"({SYSTEM})"))


def forced_off(value: str) -> tuple[str, ...]:
    """The paths `LLMTAP_FAST_PATHS` turns off: "" or "on" none, "off" all, "off:a,b" those."""
    value = value.strip().lower()
    if value in ("", "on"):
        return ()
    if value == "off":
        return NAMES
    names = tuple(n.strip() for n in value.removeprefix("off:").split(",")) if value.startswith("off:") else ()
    unknown = [n for n in names if n not in NAMES]
    if not names or unknown:
        raise ValueError(f"{ENV} is on, off or off:{','.join(NAMES)} (some of them), not {value!r}")
    return names


@cache
def shapes() -> tuple[tuple[str, str], ...]:
    """(path, why it is refused) for each path this aiohttp does not fit; () when all fit."""
    why_version = version_refusal(aiohttp.__version__)
    checks: dict[str, Callable[[], str | None]] = {
        "body_pipe": body_pipe_shape, "arrival": arrival_shape, "headers_later": headers_later_shape,
        "conn_timing": lambda: None,  # its attribute is checked on each connector (conn_timing.py)
        "kernel_stamps": kernel_stamps_shape,
    }
    refused = []
    for name, check in checks.items():
        try:
            why = why_version or check()
        except Exception as exc:  # a shape so foreign that looking at it failed
            why = f"probe failed: {type(exc).__name__}: {exc}"
        if why:
            refused.append((name, why))
    return tuple(refused)


def version_refusal(version: str) -> str | None:
    found = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)", version)
    if found is None:
        return f"aiohttp {version} is a pre-release or local build, not a tested release"
    release = tuple(int(part) for part in found.groups())
    if release > NEWEST:
        return f"aiohttp {version} is newer than {_dotted(NEWEST)}, the last release these internals were tested on"
    if release < OLDEST:
        return f"aiohttp {version} is older than {_dotted(OLDEST)}"
    return None


def body_pipe_shape(reader: type[Any] = aiohttp.StreamReader, client: type | None = None, server: type | None = None,
                    writer: type | None = None) -> str | None:
    """body_pipe.py: the reader's class switched to `_PipedReader` (its parser's `feed_data` and HTTP
    chunk marks), its `_buffer` and `_protocol` (the upstream connection: `read_timeout`,
    `pause_reading`, `resume_reading`), the client's `writing_paused` and `StreamWriter.chunked`.
    aiohttp's private modules are imported here: one that moved refuses the path, never the start."""
    from aiohttp.base_protocol import BaseProtocol
    from aiohttp.client_proto import ResponseHandler
    from aiohttp.http_writer import StreamWriter

    client, server, writer = client or ResponseHandler, server or BaseProtocol, writer or StreamWriter
    if getattr(reader, "__slots__", None) != READER_SLOTS:
        return f"{_name(reader)}'s fields are not those of aiohttp {_dotted(NEWEST)}"
    if (why := _methods(reader, READER_METHODS)) is not None:
        return why
    if not inspect.iscoroutinefunction(reader.wait_eof):
        return f"{_name(reader)}.wait_eof is not a coroutine"
    timeout = inspect.getattr_static(client, "read_timeout", None)
    if not isinstance(timeout, property) or timeout.fset is None:
        return f"{_name(client)}.read_timeout is not a property with a setter"
    if (why := _methods(client, {"pause_reading": "self", "resume_reading": "self, resume_parser=True"})) is not None:
        return why
    if not isinstance(inspect.getattr_static(server, "writing_paused", None), property):
        return f"{_name(server)}.writing_paused is not a property"
    if not isinstance(inspect.getattr_static(writer, "chunked", None), bool):
        return f"{_name(writer)}.chunked is not a flag"
    return None


def arrival_shape(handler: type = web.RequestHandler, server: type = web.Server,
                  runner: type = web.AppRunner) -> str | None:
    """arrival.py: `AppRunner._make_server`'s server gets its class switched (its `__call__` makes
    handlers from `_loop` and `_kwargs`); the handler's `data_received` reads `_messages`,
    `_request_count`, `_payload_parser` and `_upgraded`; `take` reads the request's `_message`."""
    fields = {name for cls in handler.__mro__ for name in getattr(cls, "__slots__", ())}
    if missing := [name for name in HANDLER_FIELDS if name not in fields]:
        return f"{_name(handler)} has no {', '.join(missing)}"
    if (why := _methods(handler, {"data_received": "self, data"})) is not None:
        return why
    if not inspect.iscoroutinefunction(getattr(runner, "_make_server", None)):
        return f"{_name(runner)} has no coroutine _make_server"
    loop = object()  # the server keeps what it is given, and makes nothing at its construction
    made = vars(server(_no_handler, loop=loop, probe=True))
    if made.get("_loop") is not loop or made.get("_kwargs") != {"probe": True}:
        return f"{_name(server)} keeps its loop and handler arguments elsewhere than _loop and _kwargs"
    if "_message" not in getattr(web.BaseRequest, "ATTRS", ()):
        return "BaseRequest has no _message"
    return None


def kernel_stamps_shape(handler: type = web.RequestHandler, client: type | None = None) -> str | None:
    """kernel_timing.py: both ends' protocols are read by llmtap while aiohttp's flow control does not
    hold them (`_reading_paused`, `_buffer_paused`), their `data_received` fed by it; the server
    handler's `_resume_transport_reading` is overridden (arrival.py) while llmtap reads."""
    from aiohttp.client_proto import ResponseHandler

    client = client or ResponseHandler
    for cls in (handler, client):
        fields = {name for c in cls.__mro__ for name in getattr(c, "__slots__", ())}
        if missing := [name for name in kernel_timing.FLOW_FIELDS if name not in fields]:
            return f"{_name(cls)} has no {', '.join(missing)}"
        if (why := _methods(cls, {"data_received": "self, data"})) is not None:
            return why
    return _methods(handler, {"_resume_transport_reading": "self"})


def headers_later_shape(response: type = web.StreamResponse, whole: type = web.Response) -> str | None:
    """reverse.py's `_Answer`: `_send_headers_immediately` False, as `web.Response` has it."""
    if vars(response).get("_send_headers_immediately") is not True or \
            inspect.getattr_static(whole, "_send_headers_immediately", None) is not False:
        return f"{_name(response)} does not choose when to send headers by _send_headers_immediately"
    return None


async def _no_handler(request: web.BaseRequest) -> web.StreamResponse:  # pragma: no cover (never called)
    raise NotImplementedError


def _methods(cls: type, expected: Mapping[str, str]) -> str | None:
    for name, params in expected.items():
        method = getattr(cls, name, None)
        if not callable(method):
            return f"{_name(cls)} has no {name}"
        if (found := _params(method)) != params:
            return f"{_name(cls)}.{name} takes ({found}), not ({params})"
    return None


def _params(method: Callable[..., Any]) -> str:
    def one(p: inspect.Parameter) -> str:
        if p.default is inspect.Parameter.empty:
            return p.name
        shown = repr(p.default) if isinstance(p.default, (int, float, str, bool, type(None))) else "<sentinel>"
        return f"{p.name}={shown}"
    return ", ".join(one(p) for p in inspect.signature(method).parameters.values())


def _name(cls: type) -> str:
    return cls.__name__


def _dotted(version: tuple[int, ...]) -> str:
    return ".".join(map(str, version))

