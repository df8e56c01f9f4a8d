"""Doctor checks on each upstream: DNS, TCP, TLS, then an authenticated GET of its model list."""

from __future__ import annotations

import ipaddress
import socket
import ssl
from urllib.parse import urlsplit

from . import reach
from .check import Check, fail, ok, warn


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


def upstream(url: str, env: dict[str, str], timeout: float, ca_bundle: str | None) -> list[Check]:
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    subject = f"upstream {url}"
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
                              "check the URL and port; a firewall may require an HTTP proxy, "
                              "which llmtap does not use for its upstream")]
    checks.append(ok(subject, f"TCP: connected to {host}:{port}"))
    if parts.scheme == "https":
        try:
            version = reach.tls_handshake(sock, host, ca_bundle)
        except ssl.SSLCertVerificationError as exc:
            return checks + [fail(subject, f"TLS: certificate not trusted: {exc.verify_message}",
                                  "behind a corporate TLS proxy, give its CA: llmtap serve --ca-bundle FILE")]
        except (ssl.SSLError, OSError) as exc:
            return checks + [fail(subject, f"TLS: handshake failed: {exc}",
                                  "is it really https? an http:// server on this port fails like this")]
        checks.append(ok(subject, f"TLS: {version}, certificate valid for {host}"))
    else:
        sock.close()
    return checks + [_models(url, subject, env, timeout, ca_bundle)]


def _models(url: str, subject: str, env: dict[str, str], timeout: float, ca_bundle: str | None) -> Check:
    models_url, headers, key_name, known = models_request(url, env)
    path = urlsplit(models_url).path
    if key_name is None and known:
        return warn(subject, f"GET {path} not tried: no API key in this shell",
                    "fine if the tools bring their own key; set the key variable to check it here")
    try:
        answer = reach.get(models_url, headers, timeout, ca_bundle)
    except (OSError, ValueError) as exc:
        return fail(subject, f"GET {path}: no answer within {timeout:g} s ({exc})",
                    "the upstream accepts connections but does not answer HTTP")
    auth = f" with {key_name}" if key_name else " without a key"
    if 200 <= answer.status < 300:
        return ok(subject, f"GET {path}{auth}: {answer.status}" + (" (key accepted)" if key_name else ""))
    if answer.status in (401, 403):
        return fail(subject, f"GET {path}{auth}: {answer.status}: the key was refused",
                    f"check {key_name or 'the key variable'} (llmtap doctor shows its fingerprint above)")
    if answer.status in (404, 405) and not known:
        return ok(subject, f"GET {path}: {answer.status}: this API has no model list there (the upstream answers)")
    return warn(subject, f"GET {path}{auth}: HTTP {answer.status}", "the upstream answers, but not with its model list")
