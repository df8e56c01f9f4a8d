"""The moments of one request's upstream connection, and the breakdown columns made from them."""

from __future__ import annotations


class ConnectionMarks:
    """Where the wait between `upstream_sent` and the upstream's headers went: the moments of one
    request's upstream connection (perf_counter_ns), stamped by the upstream connector's hooks
    (proxy/relay/conn_timing.py says which hook marks which). `parts` makes them the breakdown columns;
    docs/breakdown-and-compare.md defines each."""

    __slots__ = ("tls", "start", "dns_start", "dns_end", "sock", "tcp_end", "handshake", "hello", "flight", "ready",
                 "sending", "answered", "reused")

    def __init__(self, tls: bool) -> None:
        self.tls = tls  # an https upstream: a new connection has a TLS handshake
        self.begin(None)
        self.reused: bool | None = None

    def begin(self, t_ns: int | None) -> None:
        """The connector was asked for a connection (again, on a retry: the marks start over)."""
        self.start = t_ns
        self.dns_start: int | None = None  # a DNS lookup (never for an IP or a cached name)
        self.dns_end: int | None = None
        self.sock: int | None = None  # a TCP connect began
        self.tcp_end: int | None = None  # TCP connected (through a forward proxy: its tunnel too)
        self.handshake: int | None = None  # ns, the kernel's SYN -> SYN-ACK (TCP_INFO), where it has it
        self.hello: int | None = None  # the TLS handshake began: llmtap's ClientHello was about to leave
        self.flight: int | None = None  # the upstream's TLS 1.3 flight (ServerHello ... Finished) in the kernel
        self.ready: int | None = None  # a connection to send on: a pooled one taken, or a new one up
        self.sending: int | None = None  # the request's write, where it came after a loop turn
        self.answered: int | None = None  # the response's first byte, by the kernel's receive time

    @classmethod
    def open_already(cls, t_ns: int) -> ConnectionMarks:
        """A response on a connection opened before the request arrived (a WebSocket turn)."""
        marks = cls(False)
        marks.start = marks.ready = t_ns
        marks.reused = True
        return marks

    def parts(self, sent: int | None, headers: int | None) -> tuple[float | None, ...]:
        """(pool_wait, dns, connect, tls, upstream_wait, proxy_wait) in ms: intervals from `sent` to
        `headers` (the moment llmtap had the response's headers), so they add up to `headers - sent`
        exactly. A reused connection spends 0 on DNS, TCP and TLS; a plain-http one 0 on TLS. None
        where a moment never came (a connection that failed, a request that never got headers), or
        for TLS when the connector could not be hooked (proxy/relay/conn_timing.py: the handshake is then
        inside `connect`). `proxy_wait` is llmtap's own time among them (see `_own`)."""
        parts = self._parts(sent, headers)
        return self._own(parts, headers)

    def _own(self, parts: tuple[float | None, ...], headers: int | None) -> tuple[float | None, ...]:
        """Move llmtap's own time out of the network's and the upstream's parts into `proxy_wait`:

        - of `connect`, all but the kernel's SYN -> SYN-ACK (`handshake`): the socket waiting for its
          SYN to leave, and the connection, once up, waiting for llmtap to notice;
        - of `tls`, the time from the TCP connection up to the TLS handshake's start (`hello`: the
          loop turn before the ClientHello is written), and from the upstream's TLS 1.3 flight
          reaching the kernel (`flight`: its ServerHello ... Finished, the handshake's last bytes from
          the upstream) to the connection ready: the flight waiting to be read, llmtap's own TLS work
          (verifying the certificate, its Finished), and aiohttp handing the connection over;
        - of `upstream_wait`, the time from the connection ready to the request's write
          (`sending`: aiohttp writes it from a task of its own, a loop turn later), and from the
          response's first byte in the kernel (`answered`) to llmtap having the headers: the bytes
          waiting to be read, the headers to be noticed.

        Each moved time is cut from the part it was in, so the sum stays the same, to the float."""
        pool_wait, dns, connect, tls, upstream_wait = parts
        own = 0.0 if upstream_wait is not None or connect is not None else None
        if connect is not None and self.handshake is not None and not self.reused:
            wire = min(connect, max(self.handshake / 1e6, 0.0))
            own, connect = connect - wire, wire
        ready = self.ready
        tcp_end = self.tcp_end
        if tls is not None and not self.reused and tcp_end is not None and ready is not None:
            begin = self.hello if self.hello is not None and tcp_end <= self.hello <= ready else tcp_end
            end = self.flight if self.flight is not None and begin <= self.flight <= ready else ready
            if begin != tcp_end or end != ready:
                wire = _ms(end, begin) or 0.0
                own, tls = (own or 0.0) + (tls - wire), wire
        if upstream_wait is None or headers is None or ready is None:
            return pool_wait, dns, connect, tls, upstream_wait, own
        begin = self.sending if self.sending is not None and ready <= self.sending <= headers else ready
        end = self.answered if self.answered is not None and begin <= self.answered <= headers else headers
        if begin != ready or end != headers:
            wait = _ms(end, begin) or 0.0
            own, upstream_wait = (own or 0.0) + (upstream_wait - wait), wait
        return pool_wait, dns, connect, tls, upstream_wait, own

    def _parts(self, sent: int | None, headers: int | None) -> tuple[float | None, ...]:
        ready, start = self.ready, self.start
        if self.reused:
            return _ms(ready, sent), 0.0, 0.0, 0.0, _ms(headers, ready)
        if start is None:  # no connection was asked for (the request failed before)
            return None, None, None, None, None
        # opening the new connection began with the DNS lookup, else with the TCP connect
        opening = next((t for t in (self.dns_start, self.sock) if t is not None and t >= start), start)
        dns_end = self.dns_end if self.dns_start is not None and self.dns_end is not None else opening
        dns_end = max(dns_end, opening)
        tcp = self.tcp_end if self.tcp_end is not None and self.tcp_end >= dns_end else None
        if ready is None:  # the connection failed: as far as it got
            return _ms(opening, sent), _ms(dns_end, opening), _ms(tcp, dns_end), None, None
        if not self.tls:
            connect, tls = _ms(ready, dns_end), 0.0
        elif tcp is None or tcp > ready:
            connect, tls = _ms(ready, dns_end), None
        else:
            connect, tls = _ms(tcp, dns_end), _ms(ready, tcp)
        return _ms(opening, sent), _ms(dns_end, opening), connect, tls, _ms(headers, ready)


def _ms(end: int | None, begin: int | None) -> float | None:
    return None if end is None or begin is None else (end - begin) / 1e6
