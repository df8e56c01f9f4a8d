"""https for the simulated upstream (`mock-upstream --tls`): a server context for its port.

Either a private CA made at start (trustme, a test and benchmark dependency, imported only here
and only when asked for: `pip install trustme`), whose certificate for 127.0.0.1, ::1 and
localhost the simulator serves and whose CA certificate is written to a file for the client to
trust (`llmtap serve --ca-bundle FILE`); or a certificate and key of the caller's.
"""

from __future__ import annotations

import ssl
from pathlib import Path


class TLSSetupError(ValueError):
    """The simulator cannot serve https as asked; the message says why and what to do."""


def private_ca_context(ca_file: Path) -> ssl.SSLContext:
    """A server context with a fresh private CA's certificate for this machine's loopback names;
    the CA's certificate (PEM) is written to `ca_file`."""
    try:
        import trustme
    except ImportError:
        raise TLSSetupError("--tls makes its certificate with trustme, which is not installed: "
                            "`pip install trustme`, or give --tls-cert and --tls-key") from None
    ca = trustme.CA()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1", "::1", "localhost").configure_cert(context)
    ca_file.parent.mkdir(parents=True, exist_ok=True)
    ca.cert_pem.write_to_path(str(ca_file))
    return context


def pair_context(cert: Path, key: Path) -> ssl.SSLContext:
    """A server context with the caller's certificate (chain) and key, PEM files."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(str(cert), str(key))
    except (OSError, ssl.SSLError) as exc:
        reason = getattr(exc, "strerror", None) or getattr(exc, "reason", None) or str(exc)
        raise TLSSetupError(f"cannot load --tls-cert {cert} with --tls-key {key}: {reason}") from None
    return context
