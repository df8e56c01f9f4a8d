"""Who may use the relay: not a web page, unless told so.

A page on any site can make the user's browser send requests to 127.0.0.1:8787: a "simple"
cross-site POST (`Content-Type: text/plain`) needs no preflight, and a DNS-rebinding page
(its own name, re-pointed at 127.0.0.1) can even read the answers. Either would spend the
user's key, or the key llmtap injects. Browsers say where a request comes from, so:

- `Origin` (any page's request but a top-level GET) not in `--allow-origin`: refused;
- `Sec-Fetch-Site` other than `none` (the user typed the URL) or `same-origin`: refused;
- `Host` that does not name this machine (a rebinding page's own name): refused. This machine is
  `localhost`, `*.localhost`, any IP literal, a name without a dot (`llmtap` in a compose network:
  no public site has one), its host names, and the names in `--allow-host`.
  Behind `--allow-remote` other machines name it as they like, so only the first two checks hold.

CORS preflights (`OPTIONS` with `Access-Control-Request-Method`) are answered here, never relayed:
refused unless their origin is allowed. Tools (SDKs, CLIs, curl) send none of these headers.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass, field

from aiohttp import web

PREFLIGHT_MAX_AGE = "600"
_SAFE_FETCH_SITES = frozenset({"none", "same-origin"})


def _machine_names() -> set[str]:
    names = {"localhost"}
    for name in (socket.gethostname(), socket.getfqdn()):
        if name:
            names.add(name.lower())
    return names


def is_loopback(remote: str | None) -> bool:
    """A peer address on this machine (127.0.0.0/8, ::1, ::ffff:127.0.0.1)."""
    if remote == "127.0.0.1" or remote == "::1":  # the common case, without parsing
        return True
    try:
        ip = ipaddress.ip_address(remote or "")
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)  # ::ffff:127.0.0.1 from a dual-stack socket
    return (mapped or ip).is_loopback


HOSTS_REMEMBERED = 256  # Host values whose verdict is kept: a client sends the same one every time


@dataclass(frozen=True)
class Guard:
    origins: frozenset[str]  # allowed Origin values, lower case, no trailing slash ("*": any)
    hosts: frozenset[str] | None  # names accepted in Host; None: any (--allow-remote)
    _verdicts: dict[str, bool] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def build(cls, allow_origins: Iterable[str], allow_hosts: Iterable[str], remote: bool) -> "Guard":
        origins = frozenset(o.strip().rstrip("/").lower() for o in allow_origins if o.strip())
        hosts = None if remote else frozenset(_machine_names() | {h.strip().lower() for h in allow_hosts})
        return cls(origins, hosts)

    def refusal(self, request: web.Request) -> str | None:
        """Why the request may not be relayed, or None."""
        headers = request.headers
        origin = headers.get("Origin")
        if origin is not None and not self.origin_allowed(origin):
            return (f"llmtap: requests from web pages are refused (Origin {origin[:100]}); "
                    "allow a page with `llmtap serve --allow-origin ORIGIN`")
        site = headers.get("Sec-Fetch-Site")
        if site is not None and site not in _SAFE_FETCH_SITES and origin is None:
            return ("llmtap: requests from web pages of other sites are refused (Sec-Fetch-Site "
                    f"{site[:40]}); allow a page with `llmtap serve --allow-origin ORIGIN`")
        if self.hosts is not None and not self.host_allowed(request.host):
            return (f"llmtap: Host {request.host[:100]} does not name this machine (a DNS-rebinding page?); "
                    "allow a name with `llmtap serve --allow-host NAME`")
        return None

    def origin_allowed(self, origin: str) -> bool:
        return "*" in self.origins or origin.rstrip("/").lower() in self.origins

    def host_allowed(self, host: str | None) -> bool:
        """Whether `host` names this machine (remembered per Host value: parsing it costs a few µs)."""
        host = host or ""
        verdict = self._verdicts.get(host)
        if verdict is None:
            verdict = self._host_allowed(host)
            if len(self._verdicts) < HOSTS_REMEMBERED:
                self._verdicts[host] = verdict
        return verdict

    def _host_allowed(self, host: str) -> bool:
        name = _host_name(host)
        if name in self.hosts or "." not in name or name.endswith(".localhost"):  # type: ignore[operator]
            return True
        try:
            ipaddress.ip_address(name)  # an address cannot be rebound
        except ValueError:
            return False
        return True

    def preflight(self, request: web.Request) -> web.Response | None:
        """llmtap's answer to a CORS preflight: 204 with CORS headers for an allowed origin, else None."""
        origin = request.headers.get("Origin")
        if origin is None or not self.origin_allowed(origin):
            return None
        asked = request.headers.get("Access-Control-Request-Headers")
        headers = {
            "Access-Control-Allow-Origin": origin,
            "Access-Control-Allow-Methods": "GET, POST, OPTIONS",
            "Access-Control-Max-Age": PREFLIGHT_MAX_AGE,
            "Vary": "Origin",
        }
        if asked:
            headers["Access-Control-Allow-Headers"] = asked
        return web.Response(status=204, headers=headers)

    def cors_headers(self, request: web.Request) -> dict[str, str]:
        """For an allowed page's actual request: the headers that let it read the answer."""
        origin = request.headers.get("Origin")
        if origin is None:
            return {}
        return {"Access-Control-Allow-Origin": origin, "Vary": "Origin"}


def is_preflight(request: web.Request) -> bool:
    return request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers


def _host_name(host: str) -> str:
    """`name:port`, `[v6]:port`, `name.` -> the name, lower case."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    if host.count(":") == 1:
        host = host.partition(":")[0]
    return host.rstrip(".")
