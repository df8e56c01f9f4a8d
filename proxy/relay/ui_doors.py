"""The web UI's doors (`llmtap ui`): a one-time ticket, exchanged for a session only the UI's origin holds.

- `llmtap ui` asks the running proxy for a ticket (`POST /_llmtap/ui/ticket`, with the admin token)
  and opens an owner-only file that sends the browser to `/_llmtap/ui/#login=<ticket>` (argv carries
  a path, not the ticket; analysis/web/cli.py). A ticket is random, good once and for TICKET_S; the
  primary keeps the ones not yet used (in memory). The fragment never reaches a server.
- The page's script takes the ticket from its fragment, clears it from the address bar and trades it
  (`POST /_llmtap/ui/login`, from its own origin) for a session value it keeps in the origin's
  `sessionStorage` and sends in `X-Llmtap-Ui` on every API call and on the live feed (a streamed fetch).
  No cookie: a cookie goes to every port of 127.0.0.1, so any other local server would receive it
  from the browser; `sessionStorage` and a custom header belong to this origin (scheme, host, port)
  alone, and a page elsewhere cannot send the header without a preflight (refused).
- The session is `s2.<issued>.<nonce>.<HMAC-SHA256(admin token, "s2.<issued>.<nonce>")>`: any process
  holding the admin token checks it without state (a `serve --workers` worker too), and it dies with
  the token (a new one per start unless configured) or after SESSION_S.
- The UI's files (its code, no data) open to a loopback browser without a session, whatever page led
  there (`llmtap ui`'s file:// opener is another site to the browser); the session opens
  only reads: GET (and HEAD) of `/_llmtap/api/*`, `/_llmtap/live` and `/_llmtap/health`, from the page
  itself (`ui_request`). Everything that acts (`POST /_llmtap/sql`, the ticket) still needs the admin
  token, which the UI's own page never has: so there is nothing to forge (CSRF).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import OrderedDict

import orjson
from aiohttp import web

HEADER = "X-Llmtap-Ui"  # the page's session, from sessionStorage: never a cookie
LOGIN_PATH = "/_llmtap/ui/#login="  # + the ticket: read by the page's script, never sent to a server
SESSION_S = 12 * 3600
TICKET_S = 120.0
MAX_TICKETS = 64  # unused tickets kept; an older one is forgotten
MAX_LOGIN_BYTES = 1024
READ_ONLY = frozenset({"GET", "HEAD"})
SESSION_NAMES = ("api", "live", "health")  # /_llmtap/<name>... the session opens (reads only)
_VERSION = "s2"  # what the HMAC signs starts so: a value signed for anything else (the old cookie) is no session
# Every UI answer: its own files only, no inline script, no framing, no referrer, types as given.
HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; style-src 'self'; "
                               "script-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'self'; "
                               "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Cross-Origin-Opener-Policy": "same-origin",
}
_SAFE_SITES = frozenset({"same-origin", "none"})


def _sign(token: str, payload: str) -> str:
    return hmac.new(token.encode("utf-8", "surrogatepass"), payload.encode(), hashlib.sha256).hexdigest()


def make_session(token: str, now: float | None = None) -> str:
    payload = f"{_VERSION}.{int(time.time() if now is None else now)}.{secrets.token_hex(16)}"
    return f"{payload}.{_sign(token, payload)}"


def session_valid(value: str | None, token: str, now: float | None = None) -> bool:
    if not value or not token or value.count(".") != 3 or not value.startswith(_VERSION + "."):
        return False
    payload, _, mac = value.rpartition(".")
    if not hmac.compare_digest(mac.encode("utf-8", "surrogatepass"), _sign(token, payload).encode()):
        return False
    try:
        issued = int(payload.split(".")[1])
    except ValueError:
        return False
    age = (time.time() if now is None else now) - issued
    return -60 <= age <= SESSION_S


def _from_itself(request: web.Request) -> bool:
    """Nothing says another page sent it: Sec-Fetch-Site same-origin or none (or absent), and no Origin
    but this Host's own."""
    if request.headers.get("Sec-Fetch-Site", "same-origin") not in _SAFE_SITES:
        return False
    origin = request.headers.get("Origin")
    return origin is None or origin.lower() in (f"http://{request.host}".lower(), f"https://{request.host}".lower())


def ui_request(request: web.Request, name: str, token: str) -> bool:
    """What the UI's page may do without the admin token: read its files (code, no data), trade a
    ticket (`POST ui/login`), and, with its session in HEADER, read a name the session opens. The
    caller checks the peer and the Host."""
    head = name.partition("/")[0]
    if head == "ui" and name != "ui/login":  # whoever navigates here, `llmtap ui`'s file:// opener too
        return request.method in READ_ONLY
    if not _from_itself(request):
        return False
    if name == "ui/login":
        return request.method == "POST"
    return request.method in READ_ONLY and head in SESSION_NAMES and session_valid(request.headers.get(HEADER), token)


class Tickets:
    """The primary's unused tickets: each good once, for TICKET_S."""

    def __init__(self) -> None:
        self._open: OrderedDict[str, float] = OrderedDict()

    def issue(self) -> str:
        ticket = secrets.token_urlsafe(32)
        self._open[ticket] = time.monotonic() + TICKET_S
        while len(self._open) > MAX_TICKETS:
            self._open.popitem(last=False)
        return ticket

    def redeem(self, ticket: str) -> bool:
        until = self._open.pop(ticket, None) if ticket else None
        return until is not None and time.monotonic() <= until


def _answer(data: dict[str, str], status: int) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(data), headers={**HEADERS, "Content-Type": "application/json"})


async def login(request: web.Request, tickets: Tickets, token: str) -> web.Response:
    """`POST /_llmtap/ui/login` `{"ticket": T}` from the page: T (once) for `{"session": S}`."""
    try:
        body = await request.content.read(MAX_LOGIN_BYTES)
        ticket = orjson.loads(body).get("ticket", "")
    except (ValueError, AttributeError):
        ticket = ""
    if not isinstance(ticket, str) or not tickets.redeem(ticket):
        return _answer({"error": "this login link was used already or is too old: run `llmtap ui` again "
                                 "for a new one"}, 403)
    return _answer({"session": make_session(token)}, 200)
