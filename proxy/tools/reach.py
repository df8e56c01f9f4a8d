"""Network probes for `llmtap doctor`: does anything listen, resolve, connect, shake hands, answer.

All of them are blocking and bounded by a timeout. They reach an upstream the
way the proxy will (proxy/settings/egress.py): directly, or through the forward proxy
given, with the same CAs; never through a proxy the environment names otherwise.
"""

from __future__ import annotations

import concurrent.futures
import http.client
import re
import socket
import ssl
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from proxy.settings.egress import ForwardProxy, client_ssl_context

LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


def is_loopback(host: str) -> bool:
    import ipaddress

    host = host.strip("[]").lower()
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def listening(host: str, port: int, timeout: float = 1.0) -> bool:
    """Whether a TCP connection to host:port succeeds."""
    try:
        with socket.create_connection((host.strip("[]"), port), timeout=timeout):
            return True
    except OSError:
        return False


def resolve(host: str, port: int, timeout: float) -> list[str]:
    """The host's addresses; raises OSError (socket.gaierror) or TimeoutError."""
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    try:
        future = pool.submit(socket.getaddrinfo, host, port, 0, socket.SOCK_STREAM)
        try:
            infos = future.result(timeout)
        except concurrent.futures.TimeoutError:
            raise TimeoutError(f"no answer from DNS within {timeout:g} s") from None
    finally:
        pool.shutdown(wait=False)
    return sorted({str(info[4][0]) for info in infos})


def connect(host: str, port: int, timeout: float) -> socket.socket:
    return socket.create_connection((host, port), timeout=timeout)


def tls_context(ca_bundle: str | None, env: Mapping[str, str] | None = None) -> ssl.SSLContext:
    """The proxy's own: the system store plus the extra bundles (raises egress.EgressError for a bad one)."""
    return client_ssl_context(ca_bundle, env)


def tls_handshake(sock: socket.socket, host: str, ca_bundle: str | None, env: Mapping[str, str] | None = None) -> str:
    """The negotiated TLS version; raises ssl.SSLError (ssl.SSLCertVerificationError for a bad chain)."""
    with tls_context(ca_bundle, env).wrap_socket(sock, server_hostname=host) as tls:
        return tls.version() or "TLS"


class TunnelRefused(OSError):
    """The forward proxy answered CONNECT with `status` instead of 200."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status


def tunnel_tls(proxy: ForwardProxy, host: str, port: int, timeout: float, ca_bundle: str | None,
               env: Mapping[str, str] | None = None) -> str:
    """CONNECT through `proxy`, then TLS to host: the negotiated version. Raises TunnelRefused,
    ssl.SSLError or OSError."""
    conn = _tunnel(proxy, host, port, timeout, tls_context(ca_bundle, env))
    try:
        conn.connect()
        return conn.sock.version() or "TLS"  # type: ignore[union-attr]
    except OSError as exc:
        raise _refused(exc) from None
    finally:
        conn.close()


def _tunnel(proxy: ForwardProxy, host: str, port: int, timeout: float,
            context: ssl.SSLContext) -> http.client.HTTPSConnection:
    conn = http.client.HTTPSConnection(proxy.host, proxy.port, timeout=timeout, context=context)
    auth = proxy.basic_auth()
    conn.set_tunnel(host, port, headers={"Proxy-Authorization": auth} if auth else None)
    return conn


_TUNNEL_FAILED = re.compile(r"Tunnel connection failed: (\d{3})")


def _refused(exc: OSError) -> OSError:
    found = _TUNNEL_FAILED.search(str(exc))
    return TunnelRefused(int(found.group(1)), str(exc)) if found and not isinstance(exc, ssl.SSLError) else exc


@dataclass(frozen=True)
class HttpAnswer:
    status: int
    body: bytes


def get(url: str, headers: dict[str, str], timeout: float, ca_bundle: str | None,
        proxy: ForwardProxy | None = None, env: Mapping[str, str] | None = None) -> HttpAnswer:
    """One GET, directly or through `proxy`; an HTTP error status is an answer, not an exception."""
    if proxy is not None:
        return _get_through(proxy, url, headers, timeout, tls_context(ca_bundle, env))
    handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]
    if url.startswith("https:"):
        handlers.append(urllib.request.HTTPSHandler(context=tls_context(ca_bundle, env)))
    opener = urllib.request.build_opener(*handlers)
    request = urllib.request.Request(url, headers=headers)
    try:
        with opener.open(request, timeout=timeout) as response:
            return HttpAnswer(response.status, response.read(2048))
    except urllib.error.HTTPError as exc:
        return HttpAnswer(exc.code, exc.read(2048))


def _get_through(proxy: ForwardProxy, url: str, headers: dict[str, str], timeout: float,
                 context: ssl.SSLContext) -> HttpAnswer:
    """GET via the forward proxy: a CONNECT tunnel for https, the absolute URL for http (as aiohttp does)."""
    parts = urlsplit(url)
    conn: http.client.HTTPConnection
    if parts.scheme == "https":
        conn = _tunnel(proxy, parts.hostname or "", parts.port or 443, timeout, context)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    else:
        conn = http.client.HTTPConnection(proxy.host, proxy.port, timeout=timeout)
        target = url
        if auth := proxy.basic_auth():
            headers = {**headers, "Proxy-Authorization": auth}
    try:
        conn.request("GET", target, headers=headers)
        response = conn.getresponse()
        return HttpAnswer(response.status, response.read(2048))
    except OSError as exc:
        raise _refused(exc) from None
    finally:
        conn.close()
