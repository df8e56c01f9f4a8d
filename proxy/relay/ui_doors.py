"""The web UI's doors (`llmtap ui`), as Jupyter does them: a one-time ticket, exchanged for a cookie.

- `llmtap ui` asks the running proxy for a ticket (`POST /_llmtap/ui/ticket`, with the admin token)
  and opens `/_llmtap/ui/login?ticket=...` in the browser. A ticket is random, good once and for
  TICKET_S; the primary keeps the ones not yet used (in memory).
- The login answers a cookie (`HttpOnly`, `SameSite=Strict`, `Path=/_llmtap/`) and a redirect to
  the UI, so that the ticket leaves the address bar; the page never sees a secret (not in its HTML,
  nor in `localStorage`: its script cannot read an HttpOnly cookie).
- The cookie is `v1.<issued>.<nonce>.<HMAC-SHA256(admin token, "v1.<issued>.<nonce>")>`: any process
  holding the admin token checks it without state (a `serve --workers` worker too), and it dies with
  the token (a new one per start unless configured) or after COOKIE_S.
- The cookie opens only reads: GET (and HEAD) of the UI's files, `/_llmtap/api/*`, `/_llmtap/live` and
  `/_llmtap/health`, from the page itself (`cookie_request`). Everything that acts (`POST /_llmtap/sql`,
  the ticket) still needs the admin token in a header, which no page can send cross-site without a
  preflight (refused) and which the UI's own page never has: so there is nothing to forge (CSRF).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import OrderedDict

from aiohttp import web

COOKIE = "llmtap_ui"
COOKIE_PATH = "/_llmtap/"
COOKIE_S = 12 * 3600
TICKET_S = 120.0
MAX_TICKETS = 64  # unused tickets kept; an older one is forgotten
READ_ONLY = frozenset({"GET", "HEAD"})
COOKIE_NAMES = ("ui", "api", "live", "health")  # /_llmtap/<name>... the cookie opens (reads only)
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


def make_cookie(token: str, now: float | None = None) -> str:
    payload = f"v1.{int(time.time() if now is None else now)}.{secrets.token_hex(16)}"
    return f"{payload}.{_sign(token, payload)}"


def cookie_valid(value: str | None, token: str, now: float | None = None) -> bool:
    if not value or not token or value.count(".") != 3:
        return False
    payload, _, mac = value.rpartition(".")
    if not hmac.compare_digest(mac.encode("utf-8", "surrogatepass"), _sign(token, payload).encode()):
        return False
    try:
        issued = int(payload.split(".")[1])
    except ValueError:
        return False
    age = (time.time() if now is None else now) - issued
    return -60 <= age <= COOKIE_S


def cookie_request(request: web.Request, name: str, token: str) -> bool:
    """A read the UI's own page makes with its cookie: GET/HEAD of a name the cookie opens, a valid
    cookie, and nothing that says another page sent it (Sec-Fetch-Site other than same-origin or
    none; an Origin other than this Host's own). The caller checks the peer and the Host."""
    if request.method not in READ_ONLY or name.partition("/")[0] not in COOKIE_NAMES:
        return False
    if not cookie_valid(request.cookies.get(COOKIE), token):
        return False
    if request.headers.get("Sec-Fetch-Site", "same-origin") not in _SAFE_SITES:
        return False
    origin = request.headers.get("Origin")
    return origin is None or origin.lower() in (f"http://{request.host}".lower(), f"https://{request.host}".lower())


def login_request(request: web.Request, name: str) -> bool:
    """The ticket's exchange: a GET the person's browser makes (typed, or opened by `llmtap ui`)."""
    return (name == "ui/login" and request.method == "GET"
            and request.headers.get("Sec-Fetch-Site", "none") in _SAFE_SITES
            and "Origin" not in request.headers)


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


def login(request: web.Request, tickets: Tickets, token: str) -> web.Response:
    """`GET /_llmtap/ui/login?ticket=T`: T (once) for the cookie, then to the UI without T in the URL."""
    if not tickets.redeem(request.query.get("ticket", "")):
        return web.Response(status=403, text="llmtap: this login link was used already or is too old: "
                            "run `llmtap ui` again for a new one\n", headers=HEADERS)
    response = web.Response(status=303, headers={**HEADERS, "Location": "/_llmtap/ui/"})
    response.set_cookie(COOKIE, make_cookie(token), path=COOKIE_PATH, httponly=True, samesite="Strict",
                        max_age=COOKIE_S)
    return response
