"""Network probes for `llmtap doctor`: does anything listen, resolve, connect, shake hands, answer.

All of them are blocking, bounded by a timeout, and never go through HTTP_PROXY
(llmtap itself connects to its upstream directly).
"""

from __future__ import annotations

import concurrent.futures
import socket
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass

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


def tls_context(ca_bundle: str | None) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=ca_bundle) if ca_bundle else ssl.create_default_context()


def tls_handshake(sock: socket.socket, host: str, ca_bundle: str | None) -> str:
    """The negotiated TLS version; raises ssl.SSLError (ssl.SSLCertVerificationError for a bad chain)."""
    with tls_context(ca_bundle).wrap_socket(sock, server_hostname=host) as tls:
        return tls.version() or "TLS"


@dataclass(frozen=True)
class HttpAnswer:
    status: int
    body: bytes


def get(url: str, headers: dict[str, str], timeout: float, ca_bundle: str | None) -> HttpAnswer:
    """One GET without any proxy; an HTTP error status is an answer, not an exception."""
    handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]
    if url.startswith("https:"):
        handlers.append(urllib.request.HTTPSHandler(context=tls_context(ca_bundle)))
    opener = urllib.request.build_opener(*handlers)
    request = urllib.request.Request(url, headers=headers)
    try:
        with opener.open(request, timeout=timeout) as response:
            return HttpAnswer(response.status, response.read(2048))
    except urllib.error.HTTPError as exc:
        return HttpAnswer(exc.code, exc.read(2048))
