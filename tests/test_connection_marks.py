"""The breakdown's parts from a connection's moments (the meter's ConnectionMarks, no I/O): a new
TLS connection's handshake is counted from the ClientHello to the upstream's flight in the kernel,
llmtap's own time around it goes to proxy_wait, and the parts still add up to the whole."""

from __future__ import annotations

import pytest

from proxy.meter.connection_marks import ConnectionMarks

MS = 1_000_000  # ns


def marks(**moments: int | None) -> ConnectionMarks:
    m = ConnectionMarks(tls=True)
    m.begin(0)
    m.sock, m.tcp_end, m.ready, m.reused = 1 * MS, 3 * MS, 20 * MS, False
    for name, value in moments.items():
        setattr(m, name, value)
    return m


def named(parts: tuple[float | None, ...]) -> dict[str, float | None]:
    return dict(zip(("pool_wait", "dns", "connect", "tls", "upstream_wait", "proxy_wait"), parts))


@pytest.mark.unit
def test_the_handshake_runs_from_the_client_hello_to_the_upstreams_flight() -> None:
    p = named(marks(hello=4 * MS, flight=9 * MS).parts(0, 30 * MS))
    assert p["connect"] == pytest.approx(2.0) and p["tls"] == pytest.approx(5.0)
    assert p["proxy_wait"] == pytest.approx(1.0 + 11.0)  # 3 -> 4 (the ClientHello's turn), 9 -> 20 (reading it)
    assert sum(v for v in p.values() if v is not None) == pytest.approx(30.0, abs=1e-9)


@pytest.mark.unit
def test_without_the_moments_the_handshake_is_all_of_it() -> None:
    p = named(marks().parts(0, 30 * MS))
    assert p["tls"] == pytest.approx(17.0) and p["proxy_wait"] == pytest.approx(0.0)
    late = named(marks(hello=4 * MS, flight=25 * MS).parts(0, 30 * MS))  # a stamp after `ready`: not used
    assert late["tls"] == pytest.approx(16.0) and late["proxy_wait"] == pytest.approx(1.0)


@pytest.mark.unit
def test_a_reused_connection_has_no_handshake() -> None:
    m = marks(hello=4 * MS, flight=9 * MS)
    m.reused = True
    p = named(m.parts(0, 30 * MS))
    assert p["connect"] == 0 and p["tls"] == 0 and p["pool_wait"] == pytest.approx(20.0)
