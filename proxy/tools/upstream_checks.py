"""Doctor checks on each upstream: DNS, TCP, TLS, then an authenticated GET of its model list.

Through a forward proxy (the one the proxy would use, proxy/settings/egress.py): TCP to
the proxy, its CONNECT tunnel and TLS for https, then the GET through it.
"""

from __future__ import annotations

import ipaddress
import socket
import ssl
from urllib.parse import urlsplit

from proxy.settings.egress import EgressError, ForwardProxy
from proxy.tools import reach
from proxy.tools.check import Check, fail, ok, warn


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


def models_request(upstream: str, env: dict[str, str]) -> tuple[str, dict[str, str], str | None, bool]:
    """(URL, headers, the key variable used, whether this API is known to list models there)."""
    host = (urlsplit(upstream).hostname or "").lower()
    base = upstream.rstrip("/")
    if "anthropic" in host:
        headers = {"anthropic-version": "2023-06-01"}
        if env.get("ANTHROPIC_API_KEY", "").strip():
            headers["x-api-key"] = env["ANTHROPIC_API_KEY"].strip()
            return base + "/v1/models", headers, "ANTHROPIC_API_KEY", True
        if env.get("ANTHROPIC_AUTH_TOKEN", "").strip():
            headers["Authorization"] = "Bearer " + env["ANTHROPIC_AUTH_TOKEN"].strip()
            return base + "/v1/models", headers, "ANTHROPIC_AUTH_TOKEN", True
        return base + "/v1/models", headers, None, True
    if "googleapis" in host:
        for name in ("GEMINI_API_KEY", "GOOGLE_API_KEY"):
            if env.get(name, "").strip():
                return base + "/v1beta/models", {"x-goog-api-key": env[name].strip()}, name, True
        return base + "/v1beta/models", {}, None, True
    known = "openai" in host
    if env.get("OPENAI_API_KEY", "").strip():
        return base + "/v1/models", {"Authorization": "Bearer " + env["OPENAI_API_KEY"].strip()}, "OPENAI_API_KEY", known
    return base + "/v1/models", {}, None, known


def upstream(url: str, env: dict[str, str], timeout: float, ca_bundle: str | None,
             proxy: ForwardProxy | None = None) -> list[Check]:
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    subject = f"upstream {url}"
    try:
        reach.tls_context(ca_bundle, env)
    except EgressError as exc:
        return [fail(subject, f"TLS: {exc}", "the proxy refuses to start with it too")]
    if proxy is not None:
        return _through(proxy, url, subject, env, timeout, ca_bundle)
    checks: list[Check] = []
    if _is_ip(host):
        addresses = [host]
    else:
        try:
            addresses = reach.resolve(host, port, timeout)
        except (OSError, TimeoutError) as exc:
            return [fail(subject, f"DNS: cannot resolve {host}: {exc}",
                         "check the host name and this machine's DNS (and any VPN)")]
        checks.append(ok(subject, f"DNS: {host} -> {', '.join(addresses[:3])}"))
    try:
        sock = reach.connect(host, port, timeout)
    except OSError as exc:
        reason = "timed out" if isinstance(exc, (socket.timeout, TimeoutError)) else (exc.strerror or str(exc))
        return checks + [fail(subject, f"TCP: cannot connect to {host}:{port}: {reason}",
                              "check the URL and port; behind a firewall that requires an HTTP proxy, "
                              "set HTTPS_PROXY (or llmtap serve --upstream-proxy URL)")]
    checks.append(ok(subject, f"TCP: connected to {host}:{port}"))
    if parts.scheme == "https":
        try:
            version = reach.tls_handshake(sock, host, ca_bundle, env)
        except (ssl.SSLError, OSError) as exc:
            return checks + [_tls_failed(subject, exc, "TLS")]
        checks.append(ok(subject, f"TLS: {version}, certificate valid for {host}"))
    else:
        sock.close()
    return checks + [_models(url, subject, env, timeout, ca_bundle)]


def _tls_failed(subject: str, exc: BaseException, what: str) -> Check:
    """A TLS handshake that failed: an untrusted certificate (a corporate CA?), or not TLS at all."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return fail(subject, f"TLS: certificate not trusted: {exc.verify_message}",
                    "behind a corporate TLS proxy, give its CA: llmtap serve --ca-bundle FILE")
    return fail(subject, f"{what}: handshake failed: {exc}",
                "is it really https? an http:// server on this port fails like this")


def _through(proxy: ForwardProxy, url: str, subject: str, env: dict[str, str], timeout: float,
             ca_bundle: str | None) -> list[Check]:
    """The upstream through the forward proxy: the proxy's port, its tunnel and TLS (https), the GET."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    name = f"the forward proxy {proxy.label}"
    checks = [ok(subject, f"through {name} (from {proxy.source}), as llmtap serve goes")]
    if urlsplit(proxy.url).scheme != "http":
        return checks + [warn(subject, f"{name} is an https:// proxy: doctor does not check through one")]
    try:
        reach.connect(proxy.host, proxy.port, timeout).close()
    except OSError as exc:
        reason = "timed out" if isinstance(exc, (socket.timeout, TimeoutError)) else (exc.strerror or str(exc))
        return checks + [fail(subject, f"TCP: cannot connect to {name}: {reason}",
                              f"check {proxy.source}; to go direct, add {host} to NO_PROXY")]
    checks.append(ok(subject, f"TCP: connected to {name}"))
    if parts.scheme == "https":
        try:
            version = reach.tunnel_tls(proxy, host, port, timeout, ca_bundle, env)
        except reach.TunnelRefused as exc:
            return checks + [_refused(subject, name, exc.status, f"CONNECT {host}:{port}", proxy)]
        except (ssl.SSLError, OSError) as exc:
            return checks + [_tls_failed(subject, exc, f"TLS through {name}")]
        checks.append(ok(subject, f"TLS: {version} through {name}'s tunnel, certificate valid for {host}"))
    return checks + [_models(url, subject, env, timeout, ca_bundle, proxy)]


def _refused(subject: str, name: str, status: int, what: str, proxy: ForwardProxy) -> Check:
    if status == 407:
        return fail(subject, f"{what}: {name} wants credentials, or refused them (HTTP 407)",
                    f"give them in the proxy URL ({proxy.source}): http://USER:PASSWORD@{proxy.label}")
    return fail(subject, f"{what}: {name} refused with HTTP {status}",
                "the proxy may not allow this host or port; ask its admin, or add the host to NO_PROXY")


def _models(url: str, subject: str, env: dict[str, str], timeout: float, ca_bundle: str | None,
            proxy: ForwardProxy | None = None) -> Check:
    models_url, headers, key_name, known = models_request(url, env)
    path = urlsplit(models_url).path
    if key_name is None and known:
        return warn(subject, f"GET {path} not tried: no API key in this shell",
                    "fine if the tools bring their own key; set the key variable to check it here")
    try:
        answer = reach.get(models_url, headers, timeout, ca_bundle, proxy, env)
    except reach.TunnelRefused as exc:
        assert proxy is not None
        return _refused(subject, f"the forward proxy {proxy.label}", exc.status, f"GET {path}", proxy)
    except (OSError, ValueError) as exc:
        return fail(subject, f"GET {path}: no answer within {timeout:g} s ({exc})",
                    "the upstream accepts connections but does not answer HTTP")
    if proxy is not None and answer.status == 407:
        return _refused(subject, f"the forward proxy {proxy.label}", 407, f"GET {path}", proxy)
    auth = f" with {key_name}" if key_name else " without a key"
    if 200 <= answer.status < 300:
        return ok(subject, f"GET {path}{auth}: {answer.status}" + (" (key accepted)" if key_name else ""))
    if answer.status in (401, 403):
        return fail(subject, f"GET {path}{auth}: {answer.status}: the key was refused",
                    f"check {key_name or 'the key variable'} (llmtap doctor shows its fingerprint above)")
    if answer.status in (404, 405) and not known:
        return ok(subject, f"GET {path}: {answer.status}: this API has no model list there (the upstream answers)")
    return warn(subject, f"GET {path}{auth}: HTTP {answer.status}", "the upstream answers, but not with its model list")
