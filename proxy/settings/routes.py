"""Which upstream a request goes to: a prefix table, longest prefix first."""

from __future__ import annotations

from dataclasses import dataclass, field

from yarl import URL


class RouteError(ValueError):
    """A route that cannot be used, with a message for the user."""


@dataclass(frozen=True, slots=True)
class Route:
    prefix: str  # "" for the default route, else "/name" (no trailing slash)
    upstream: URL  # scheme://host[:port][/base-path], no query
    # The upstream key llmtap puts in place of the client's (opt-in); never printed or stored.
    credential: str | None = field(default=None, repr=False, compare=False)
    # The forward proxy to reach the upstream through (proxy/settings/egress.py), decided once at start:
    # its URL without credentials, and the Proxy-Authorization header of them; None: direct.
    proxy: URL | None = field(default=None, compare=False)
    proxy_headers: dict[str, str] | None = field(default=None, repr=False, compare=False)
    base: str = field(init=False, repr=False, compare=False)  # str(upstream) without its trailing "/"

    def __post_init__(self) -> None:
        object.__setattr__(self, "base", str(self.upstream).rstrip("/"))

    @property
    def label(self) -> str:
        return self.prefix or "/"

    def target(self, path: str, query_string: str) -> URL:
        """The upstream URL for a client path (prefix already matched)."""
        rest = path[len(self.prefix):]
        if rest and not rest.startswith("/"):
            rest = "/" + rest
        raw = self.base + rest + ("?" + query_string if query_string else "")
        return URL(raw, encoded=True)  # exactly as the client encoded it


def parse_upstream(url: str) -> URL:
    parsed = URL(url.strip())
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise RouteError(f"upstream must be an http:// or https:// URL with a host, not {url!r}")
    if parsed.query_string or parsed.fragment:
        raise RouteError(f"upstream URL must not carry a query or fragment: {url!r}")
    return URL(str(parsed.origin()) + parsed.raw_path.rstrip("/"), encoded=True)


def parse_route(spec: str) -> Route:
    """`PREFIX=URL`, e.g. `/anthropic=https://api.anthropic.com`."""
    prefix, sep, url = spec.partition("=")
    if not sep:
        raise RouteError(f"route must look like PREFIX=URL, e.g. /openai=https://api.openai.com, not {spec!r}")
    return make_route(prefix, url)


def normal_prefix(prefix: str) -> str:
    prefix = "/" + prefix.strip().strip("/") if prefix.strip().strip("/") else ""
    if ".." in prefix.split("/") or prefix.startswith("/_llmtap") or prefix.startswith("/_tag"):
        raise RouteError(f"route prefix {prefix!r} is not allowed ('..', /_llmtap and /_tag are reserved)")
    return prefix


def make_route(prefix: str, url: str, credential: str | None = None) -> Route:
    return Route(prefix=normal_prefix(prefix), upstream=parse_upstream(url), credential=credential)


class RouteTable:
    def __init__(self, routes: list[Route]) -> None:
        seen: set[str] = set()
        for route in routes:
            if route.prefix in seen:
                raise RouteError(f"route prefix {route.label!r} is configured twice")
            seen.add(route.prefix)
        self.routes = sorted(routes, key=lambda r: len(r.prefix), reverse=True)

    def match(self, path: str) -> Route | None:
        for route in self.routes:
            p = route.prefix
            if not p or path == p or path.startswith(p + "/"):
                return route
        return None

    @property
    def prefixes(self) -> list[str]:
        return [r.label for r in self.routes]
