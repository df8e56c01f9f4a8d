"""How llmtap reaches its upstreams: through which forward proxy, trusting which CAs.

One owner for both, used alike by the relay (`serve`) and by `llmtap doctor`,
so that doctor tests the path the proxy will take.

Forward proxy, per route, decided once at start (never per request):
1. `[route_proxy]` "/prefix" = URL (or "none": direct) wins for its route;
2. else `upstream_proxy` (`serve --upstream-proxy URL`; "none" goes direct and
   ignores the variables below);
3. else the variables the SDKs read: `https_proxy`/`HTTPS_PROXY` for an https
   upstream, `http_proxy`/`HTTP_PROXY` for an http one (lower case first).
`no_proxy`/`NO_PROXY` applies to 2 and 3: `*`, host names (`example.com` also
matches its subdomains, `.example.com` and `*.example.com` too), `host:port`,
IP addresses and CIDR ranges (`10.0.0.0/8`). `ALL_PROXY` is not read: it is
usually a SOCKS proxy, which llmtap does not speak. Credentials in a proxy URL
(`http://user:pass@proxy:3128`) are sent as Proxy-Authorization and never
printed: messages name the proxy by host and port only.

CAs: the system store (`SSL_CERT_FILE`/`SSL_CERT_DIR` replace its default
locations, as OpenSSL does), plus each of `--ca-bundle`, `REQUESTS_CA_BUNDLE`,
`CURL_CA_BUNDLE` and `NODE_EXTRA_CA_CERTS` that is set: added to the store,
never replacing it.
"""

from __future__ import annotations

import ipaddress
import os
import ssl
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field

DIRECT = "none"
CA_BUNDLE_VARIABLES = ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS")


class EgressError(ValueError):
    """A proxy or CA setting llmtap cannot use; the message says which and how to fix it."""


@dataclass(frozen=True)
class ForwardProxy:
    """An HTTP proxy to reach an upstream through; `url` carries no credentials."""

    url: str  # scheme://host:port
    source: str  # where it was configured, for messages: "HTTPS_PROXY", "upstream_proxy", "route_proxy /x"
    user: str | None = field(default=None, repr=False)
    password: str | None = field(default=None, repr=False)

    @property
    def host(self) -> str:
        return urllib.parse.urlsplit(self.url).hostname or ""

    @property
    def port(self) -> int:
        parts = urllib.parse.urlsplit(self.url)
        return parts.port or (443 if parts.scheme == "https" else 80)

    @property
    def label(self) -> str:
        """`host:port`, the only way a proxy is named in messages."""
        host = self.host
        return f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"

    def basic_auth(self) -> str | None:
        """The Proxy-Authorization value, None without credentials."""
        if self.user is None:
            return None
        import base64

        token = f"{self.user}:{self.password or ''}".encode("latin-1")
        return "Basic " + base64.b64encode(token).decode("ascii")


def parse_proxy(value: str, source: str) -> ForwardProxy:
    """`http://[user:pass@]host[:port]` (no scheme: http); raises EgressError naming `source`, never the value."""
    text = value.strip()
    if "://" not in text:
        text = "http://" + text
    try:
        parts = urllib.parse.urlsplit(text)
        port = parts.port
    except ValueError:
        raise EgressError(f"{source}: not a proxy URL (expected http://HOST:PORT)") from None
    if parts.scheme not in ("http", "https"):
        raise EgressError(f"{source}: a {parts.scheme}:// proxy is not supported (llmtap speaks to HTTP proxies "
                          "only): give an http:// proxy, or `none` to go direct")
    if not parts.hostname:
        raise EgressError(f"{source}: a proxy URL needs a host (http://HOST:PORT)")
    host = parts.hostname
    netloc = f"[{host}]" if ":" in host else host
    url = f"{parts.scheme}://{netloc}:{port or (443 if parts.scheme == 'https' else 80)}"
    user = urllib.parse.unquote(parts.username) if parts.username is not None else None
    password = urllib.parse.unquote(parts.password) if parts.password is not None else None
    return ForwardProxy(url=url, source=source, user=user, password=password)


def hide_credentials(value: str) -> str:
    """A proxy URL as it may be printed: `http://***@host:port`."""
    try:
        parts = urllib.parse.urlsplit(value if "://" in value else "http://" + value)
    except ValueError:
        return "***"
    if parts.username is None and parts.password is None:
        return value
    return value.replace(parts.netloc, "***@" + parts.netloc.rpartition("@")[2], 1)


def _env(env: Mapping[str, str], name: str) -> tuple[str, str] | None:
    for variable in (name.lower(), name.upper()):
        value = env.get(variable, "").strip()
        if value:
            return variable, value
    return None


def bypassed(host: str, port: int, no_proxy: str) -> bool:
    """Whether NO_PROXY's value names this host (see the module docstring for the forms)."""
    host = host.strip("[]").lower().rstrip(".")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    for raw in no_proxy.replace(" ", ",").split(","):
        entry = raw.strip().lower()
        if not entry:
            continue
        if entry == "*":
            return True
        if "/" in entry:
            try:
                if address is not None and address in ipaddress.ip_network(entry, strict=False):
                    return True
            except ValueError:
                pass
            continue
        entry_port = None
        if entry.startswith("["):
            entry, _, rest = entry[1:].partition("]")
            entry_port = rest[1:] if rest.startswith(":") else None
        elif entry.count(":") == 1:
            entry, _, entry_port = entry.partition(":")
        if entry_port is not None and entry_port != str(port):
            continue
        entry = entry.removeprefix("*").lstrip(".").rstrip(".")
        if address is not None:
            try:
                if ipaddress.ip_address(entry) == address:
                    return True
            except ValueError:
                pass
            continue
        if entry and (host == entry or host.endswith("." + entry)):
            return True
    return False


def proxy_for(upstream: str, env: Mapping[str, str], upstream_proxy: str | None = None,
              route_proxy: str | None = None, route_label: str = "/") -> ForwardProxy | None:
    """The forward proxy for one route's upstream URL, None for a direct connection."""
    if route_proxy is not None and route_proxy.strip():
        if route_proxy.strip().lower() == DIRECT:
            return None
        return parse_proxy(route_proxy, f"route_proxy {route_label}")
    parts = urllib.parse.urlsplit(upstream)
    if upstream_proxy is not None and upstream_proxy.strip().lower() == DIRECT:
        return None
    no_proxy = _env(env, "no_proxy")
    if no_proxy and bypassed(parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80),
                             no_proxy[1]):
        return None
    if upstream_proxy is not None and upstream_proxy.strip():
        return parse_proxy(upstream_proxy, "upstream_proxy")
    found = _env(env, "https_proxy" if parts.scheme == "https" else "http_proxy")
    return parse_proxy(found[1], found[0]) if found else None


def ca_bundles(ca_bundle: str | None, env: Mapping[str, str]) -> list[tuple[str, str]]:
    """(where it is configured, path) of each extra CA bundle, in loading order, without repeats."""
    found = [("--ca-bundle", ca_bundle)] if ca_bundle else []
    found += [(name, env[name].strip()) for name in CA_BUNDLE_VARIABLES if env.get(name, "").strip()]
    seen: set[str] = set()
    unique = []
    for source, path in found:
        if path not in seen:
            seen.add(path)
            unique.append((source, path))
    return unique


def client_ssl_context(ca_bundle: str | None, env: Mapping[str, str] | None = None) -> ssl.SSLContext:
    """TLS to the upstreams: the system store plus every extra bundle (verification always on)."""
    env = os.environ if env is None else env
    context = ssl.create_default_context()
    _load_extra(context, ca_bundle, env)
    return context


def check_ca_bundles(ca_bundle: str | None, env: Mapping[str, str] | None = None) -> None:
    """Raise EgressError now for an extra bundle that cannot be loaded (cheap: no system store)."""
    env = os.environ if env is None else env
    if ca_bundles(ca_bundle, env):
        _load_extra(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT), ca_bundle, env)


def _load_extra(context: ssl.SSLContext, ca_bundle: str | None, env: Mapping[str, str]) -> None:
    for source, path in ca_bundles(ca_bundle, env):
        try:
            if os.path.isdir(path):
                context.load_verify_locations(capath=path)
            else:
                context.load_verify_locations(cafile=path)
        except (OSError, ssl.SSLError) as exc:
            reason = getattr(exc, "strerror", None) or getattr(exc, "reason", None) or str(exc)
            raise EgressError(f"{source} {path}: cannot load CA certificates from it ({reason}); "
                              + (f"fix it, or unset {source}" if source.isupper() else f"fix it, or give another {source}")) from None


def proxy_headers(found: ForwardProxy) -> dict[str, str] | None:
    """The proxy's credentials as the `proxy_headers` aiohttp sends it (Proxy-Authorization), None without
    (aiohttp 3.14 deprecates `proxy_auth` and `BasicAuth`)."""
    if found.user is None:
        return None
    import aiohttp

    return {"Proxy-Authorization": aiohttp.encode_basic_auth(found.user, found.password or "", encoding="latin1")}
