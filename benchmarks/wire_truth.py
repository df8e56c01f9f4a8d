"""llmtap's timing columns against the wire: recorded − the kernel's packet timestamps (#26).

Starts `llmtap mock-upstream` (its distance given inside it: `--headers-delay-ms`) and `llmtap
serve` as separate processes on loopback, captures both legs with tcpdump (nanosecond stamps, on
`lo`), loads the machine with spinning processes, and sends streamed Anthropic Messages requests
through the proxy at each concurrency, on new connections (the client closes each one, the
upstream answers `Connection: close`) and on reused ones, to a plain-http upstream and to an
https one (`mock-upstream --tls`, its private CA given to `serve --ca-bundle`). Each request carries
its tag in the `X-Llmtap-Tag` header (the row's `tag`) and in its body (which goes upstream as it
is), so every row is matched to its packets on both legs; over https, where the upstream leg is
encrypted, by the port of the connection that carried it (`x-sim-echo-peer`: the simulator names
it in a response header). Then, per column, recorded − wire at p50, p99 and max:

- `ttft`: the client's request's first packet -> the first packet to the client with a
  `content_block_delta`; `e2e`: -> the response's last packet to the client;
- `connect` (new connections): the proxy's SYN to the upstream -> the upstream's SYN-ACK;
- `tls` (new https connections): the proxy's ClientHello -> the last packet of the upstream's
  first flight (ServerHello ... Finished: the packets before the proxy's next one);
- `upstream_wait` (http: these three need the upstream leg's bytes): the request's first packet to the upstream -> the response's first packet back;
- `upstream_headers`: the client's request's first packet -> the upstream's response's first packet;
- `h2ft` (`headers_to_first_token_ms`): the upstream's response's first packet -> the first token
  to the client;
- `sum`: the breakdown's parts against `upstream_headers_ms` and `ttft_ms` (must be 0 exactly).

For https it also prints (stderr), from the wire alone, llmtap's own waits in a new connection's
handshake: SYN-ACK -> its ClientHello, and the upstream's flight -> its Finished (the flight
waiting to be read, llmtap's TLS work): what `tls_ms` must leave out.

Bounded: `--requests` per concurrency and mode (small by default), loopback only, every process
it starts (simulator, proxy, tcpdump, spinners) stopped at the end. Needs tcpdump (root), dpkt
and, for https, trustme (`pip install dpkt trustme`: the benchmark's, not llmtap's). `--code DIR` runs the proxy of another tree
(a worktree of main, to compare before and after).

    python benchmarks/wire_truth.py --requests 64
    python benchmarks/wire_truth.py --schemes https --modes new --requests 64
    python benchmarks/wire_truth.py --code /work/main --requests 64
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from overhead_procs import wait_ready
import dpkt

ROOT = Path(__file__).resolve().parent.parent
TOKEN = b"content_block_delta"
ADMIN = {"X-Llmtap-Admin-Token": "llmtap-wire-truth-admin-token"}
COLUMNS = ("ttft", "e2e", "connect", "tls", "upstream_wait", "upstream_headers", "h2ft")
PARTS = ("proxy_overhead_ms", "pool_wait_ms", "dns_ms", "connect_ms", "tls_ms", "upstream_wait_ms")
OWN = ("proxy_wait_ms",)  # llmtap's own part of the upstream's, where the proxy records it


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(code: Path, args: list[str], env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "proxy", *args], env={**env, "PYTHONPATH": str(code)},
                            cwd=code, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def one(s: aiohttp.ClientSession, base: str, tag: str, peers: dict[str, int]) -> None:
    body = {"model": "claude-x", "stream": True, "max_tokens": 100,
            "messages": [{"role": "user", "content": f"{tag} " + "hi " * 40}]}
    async with s.post(base + "/v1/messages", json=body, headers={"X-Llmtap-Tag": tag, "x-sim-echo-peer": "1"}) as r:
        if (peer := r.headers.get("x-sim-peer")) is not None:
            peers[tag] = int(peer)  # the proxy's port on the upstream connection that carried it
        async for _ in r.content.iter_any():
            pass


async def drive(base: str, tags: list[str], concurrency: int, new: bool, peers: dict[str, int] | None = None) -> None:
    queue = list(reversed(tags))
    peers = {} if peers is None else peers

    async def worker(s: aiohttp.ClientSession) -> None:
        while queue:
            await one(s, base, queue.pop(), peers)

    connector = aiohttp.TCPConnector(force_close=new, limit=0)
    async with aiohttp.ClientSession(connector=connector) as s:
        await asyncio.gather(*(worker(s) for _ in range(concurrency)))


async def wait_tls(url: str, ca: Path, deadline_s: float = 60) -> None:
    """`wait_ready` for the https simulator: its CA file written, then a HEAD / trusting it."""
    end = time.monotonic() + deadline_s
    async with aiohttp.ClientSession() as s:
        while time.monotonic() < end:
            try:
                if ca.exists() and ca.stat().st_size:
                    async with s.head(url + "/", ssl=ssl.create_default_context(cafile=str(ca))) as r:
                        if r.status < 500:
                            return
            except (aiohttp.ClientError, ssl.SSLError, OSError):
                pass
            await asyncio.sleep(0.1)
    raise SystemExit(f"{url} did not start")


async def rows(base: str, prefix: str, expected: int) -> dict[str, dict]:
    sql = f"SELECT * FROM requests WHERE tag LIKE '{prefix}%'"
    found: dict[str, dict] = {}
    end = time.monotonic() + 30
    async with aiohttp.ClientSession() as s:
        while time.monotonic() < end:
            async with s.post(base + "/_llmtap/sql", json={"sql": sql}, headers=ADMIN) as r:
                answer = await r.json()
            found = {row[answer["columns"].index("tag")]: dict(zip(answer["columns"], row)) for row in answer["rows"]}
            if len(found) >= expected:
                break
            await asyncio.sleep(0.3)
    return found


# -- the wire ------------------------------------------------------------------------

@dataclass
class Flow:
    """One TCP connection: its handshake and its payload packets, (ns, from the opener?, payload)."""
    syn: int | None = None
    synack: int | None = None
    packets: list[tuple[int, bool, bytes]] = field(default_factory=list)
    gaps: list[int] = field(default_factory=list)  # indexes of packets after a hole in the capture
    next_seq: dict[bool, int] = field(default_factory=dict)

    def add(self, t: int, opener: bool, data: bytes, seq: int, length: int) -> None:
        expected = self.next_seq.get(opener)
        if expected is not None and seq != expected:
            if (seq - expected) % 2**32 < 2**31:  # bytes the capture missed (a retransmission is not a gap)
                self.gaps.append(len(self.packets))
            else:
                return
        self.next_seq[opener] = (seq + length) % 2**32
        self.packets.append((t, opener, data))


def read_flows(pcap: Path, ports: set[int]) -> dict[tuple, Flow]:
    flows: dict[tuple, Flow] = {}
    with pcap.open("rb") as f:
        reader = dpkt.pcap.Reader(f)
        for ts, buf in reader:
            t = int(ts * 1_000_000_000)  # a Decimal from a nanosecond capture: exact
            ip = dpkt.ethernet.Ethernet(buf).data if reader.datalink() == dpkt.pcap.DLT_EN10MB else dpkt.sll.SLL(buf).data
            tcp = getattr(ip, "data", None)
            if not isinstance(tcp, dpkt.tcp.TCP):
                continue
            if tcp.dport in ports:  # from the opener to the listener
                key, opener = (tcp.sport, tcp.dport), True
            elif tcp.sport in ports:
                key, opener = (tcp.dport, tcp.sport), False
            else:
                continue
            syn, ack = tcp.flags & dpkt.tcp.TH_SYN, tcp.flags & dpkt.tcp.TH_ACK
            if syn and not ack:
                flows[key] = Flow(syn=t)  # a new connection (a reused port starts over)
                continue
            flow = flows.setdefault(key, Flow())
            if syn and ack:
                flow.synack = t
            elif tcp.data:
                length = ip.len - ip.hl * 4 - tcp.off * 4  # the payload's size, past the snap length too
                flow.add(t, opener, bytes(tcp.data), tcp.seq, length)
    return flows


@dataclass
class Exchange:
    """One request on one leg: its first packet, the answer's first and token packets, its last."""
    flow: Flow
    first_on_flow: bool
    sent: int
    answer: int | None = None
    token: int | None = None
    last: int | None = None


def exchanges(flows: dict[tuple, Flow], port: int, marker_of) -> dict[str, Exchange | None]:
    """Each request on connections to `port`, by the tag `marker_of(request bytes)` finds in it."""
    found: dict[str, Exchange | None] = {}
    for (_, listener), flow in flows.items():
        if listener != port:
            continue
        starts = [i for i, (_, opener, data) in enumerate(flow.packets) if opener and data.startswith(b"POST ")]
        for n, i in enumerate(starts):
            end = starts[n + 1] if n + 1 < len(starts) else len(flow.packets)
            mine = flow.packets[i:end]
            tag = marker_of(b"".join(d for _, o, d in mine if o))
            if tag is None:
                continue
            if any(i < g <= end for g in flow.gaps) or (n == 0 and i and flow.gaps and flow.gaps[0] <= i):
                found[tag] = None  # the capture missed some of its bytes: left out
                continue
            back = [(t, d) for t, o, d in mine if not o]
            ex = Exchange(flow, n == 0, mine[0][0])
            if back:
                ex.answer = back[0][0]
                ex.token = next((t for t, d in back if TOKEN in d), None)
                if back[-1][1].endswith(b"0\r\n\r\n"):  # the last chunk: the capture has the whole response
                    ex.last = back[-1][0]
            found[tag] = ex
    return found


def handshake(flow: Flow) -> tuple[int, int] | None:
    """A TLS connection's ClientHello (the opener's first handshake record) and the last packet of
    the listener's first flight after it (ServerHello ... Finished: up to the opener's next packet)."""
    hello = next((i for i, (_, opener, data) in enumerate(flow.packets) if opener and data[:1] == b"\x16"), None)
    if hello is None:
        return None
    end = None
    for t, opener, _ in flow.packets[hello + 1:]:
        if opener:
            break
        end = t
    return None if end is None else (flow.packets[hello][0], end)


def lateness(flows: list[Flow | None]) -> str:
    """Where llmtap's own time in new TLS connections is, by the wire: SYN-ACK -> its ClientHello
    (in `connect`'s own part and the start of `tls`), and the upstream's flight -> llmtap's next
    packet, its Finished (the flight waiting to be read, and llmtap's TLS work)."""
    hello, finished = [], []
    for flow in flows:
        shake = handshake(flow) if flow is not None else None
        if flow is None or shake is None or flow.synack is None:
            continue
        hello.append((shake[0] - flow.synack) / 1e6)
        after = next((t for t, opener, _ in flow.packets if opener and t > shake[1]), None)
        if after is not None:
            finished.append((after - shake[1]) / 1e6)
    def q(values: list[float]) -> str:
        return f"p50 {quantile(values, .5):.3f} max {max(values):.3f}" if values else "-"
    return f"wire SYN-ACK -> ClientHello {q(hello)} ms; flight -> llmtap's Finished {q(finished)} ms"


def tag_finder(prefix: str):
    needle = prefix.encode()

    def marker_of(data: bytes) -> str | None:
        at = data.find(needle)
        if at < 0:
            return None
        end = at
        while end < len(data) and (data[end:end + 1].isalnum() or data[end:end + 1] == b"-"):
            end += 1
        return data[at:end].decode()
    return marker_of


def ms(a: int | None, b: int | None) -> float | None:
    return None if a is None or b is None else (a - b) / 1e6


def differences(row: dict, client: Exchange | None, up: Exchange | None,
                tls_flow: Flow | None = None) -> dict[str, float | None]:
    """recorded − wire per column for one request (None where a side is missing). `tls_flow`: the
    upstream connection of an https request (its bytes encrypted: no `up`)."""
    d: dict[str, float | None] = {c: None for c in COLUMNS}

    def diff(recorded: float | None, wire: float | None) -> float | None:
        return None if recorded is None or wire is None else recorded - wire

    if client is not None:
        d["ttft"] = diff(row["ttft_ms"], ms(client.token, client.sent))
        d["e2e"] = diff(row["e2e_ms"], ms(client.last, client.sent))
    if tls_flow is not None and row.get("connection_reused") is False:  # the request that opened it
        d["connect"] = diff(row["connect_ms"], ms(tls_flow.synack, tls_flow.syn))
        if (shake := handshake(tls_flow)) is not None:
            d["tls"] = diff(row["tls_ms"], ms(shake[1], shake[0]))
            after = next((t for t, opener, _ in tls_flow.packets if opener and t > shake[1]), None)
            d["wire_tls_parts"] = [ms(shake[0], tls_flow.synack), ms(shake[1], shake[0]), ms(after, shake[1]),
                                   row["tls_ms"], row["proxy_wait_ms"]]  # --json only: for a look at one row
    if up is not None:
        if up.first_on_flow and row.get("connection_reused") is False:
            d["connect"] = diff(row["connect_ms"], ms(up.flow.synack, up.flow.syn))
        d["upstream_wait"] = diff(row["upstream_wait_ms"], ms(up.answer, up.sent))
    if client is not None and up is not None:
        d["upstream_headers"] = diff(row["upstream_headers_ms"], ms(up.answer, client.sent))
        d["h2ft"] = diff(row["headers_to_first_token_ms"], ms(client.token, up.answer))
    return d


def sum_error(row: dict) -> float | None:
    """The largest gap between the breakdown's parts and the two totals they make (ms)."""
    if row.get("upstream_wait_ms") is None or row.get("ttft_ms") is None:
        return None
    parts = sum(row.get(p) or 0.0 for p in PARTS + OWN)
    return max(abs(parts - row["upstream_headers_ms"]),
               abs(row["upstream_headers_ms"] + row["headers_to_first_token_ms"] - row["ttft_ms"]))


def quantile(values: list[float], q: float) -> float:
    """The nearest-rank quantile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def table(results: dict[tuple[str, int], list[dict]], sums: dict[tuple[str, int], list[float]]) -> str:
    lines = [f"{'mode':<13}{'conc':>5}  {'column':<17}{'n':>4}{'p50':>9}{'|p99|':>9}{'max':>9}"
             "   (recorded − wire, ms: p50 signed, p99 of the size, max the largest in size, signed)"]
    for (mode, conc), diffs in results.items():
        for column in COLUMNS:
            values = [d[column] for d in diffs if d[column] is not None]
            if not values:
                continue
            lines.append(f"{mode:<13}{conc:>5}  {column:<17}{len(values):>4}{quantile(values, .5):>9.3f}"
                         f"{quantile([abs(v) for v in values], .99):>9.3f}{max(values, key=abs):>9.3f}")
        errors = sums[(mode, conc)]
        if errors:
            lines.append(f"{mode:<13}{conc:>5}  {'sum (|parts-total|)':<17}{len(errors):>2}{'':>18}{max(errors):>9.6f}")
    return "\n".join(lines)


# -- the run -------------------------------------------------------------------------

def spin(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def capture(pcap: Path, ports: list[int]) -> subprocess.Popen:
    expr = " or ".join(f"tcp port {p}" for p in ports)
    proc = subprocess.Popen(["tcpdump", "-i", "lo", "-nn", "-s", "0", "-B", "16384", "-U",
                             "--time-stamp-precision=nano", "-w", str(pcap), expr],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    end = time.monotonic() + 20
    while time.monotonic() < end:  # tcpdump says so once it listens
        line = proc.stderr.readline()
        if b"listening on" in line:
            return proc
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise SystemExit("tcpdump did not start (it needs root)")


async def captured(pcap: Path, sentinel: bytes, deadline_s: float = 60) -> None:
    """Until the capture file holds `sentinel` (the packets come in order: all before it are in).
    A loaded machine runs tcpdump late; stopped at once, it would lose the ones it had not read."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if sentinel in pcap.read_bytes():
            return
        await asyncio.sleep(0.2)
    raise SystemExit("tcpdump did not keep up: the capture misses the last request")


def stop_capture(proc: subprocess.Popen) -> str:
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=20)
    return ", ".join(line for line in err.decode().splitlines() if "packets" in line)


async def run_mode(scheme: str, mode: str, args: argparse.Namespace, home: Path, env: dict[str, str],
                   results: dict, sums: dict) -> None:
    new = mode == "new"
    up_port, px_port = free_port(), free_port()
    sim = ["mock-upstream", "--port", str(up_port), "--ttft-ms", str(args.ttft_ms), "--itl-ms", str(args.itl_ms),
           "--tokens", str(args.tokens), "--prefill-us-per-token", "0", "--headers-delay-ms", str(args.distance_ms)]
    trust: list[str] = []
    if scheme == "https":
        ca = home / f"ca-{mode}.pem"
        sim += ["--tls", "--tls-ca-file", str(ca)]
        trust = ["--ca-bundle", str(ca)]
    procs = [start(args.code, sim + (["--no-keep-alive"] if new else []), env)]
    upstream = f"{scheme}://127.0.0.1:{up_port}"
    await (wait_tls(upstream, ca) if trust else wait_ready(upstream))
    procs.append(start(args.code, ["serve", "--port", str(px_port), "--upstream", upstream, "--quiet", *trust], env))
    base = f"http://127.0.0.1:{px_port}"
    label = mode if scheme == "http" else f"{scheme} {mode}"
    mode = mode if scheme == "http" else f"{scheme}{mode}"  # the tags' and the capture's names
    pcap = home / f"{mode}.pcap"
    peers: dict[str, int] = {}
    spinners: list[subprocess.Popen] = []
    dump = None
    try:
        await wait_ready(base)
        dump = capture(pcap, [up_port, px_port])
        spinners = spin(args.spinners)
        tags: dict[int, list[str]] = {}
        for conc in args.concurrency:
            tags[conc] = [f"wt{mode}{conc}x{i}" for i in range(args.requests)]
            await drive(base, tags[conc], conc, new, peers)
        for p in spinners:
            p.kill()
        spinners = []
        await drive(base, [f"wt{mode}end"], 1, new)
        await captured(pcap, f"wt{mode}end".encode())
        drops = stop_capture(dump)
        dump = None
        print(f"{mode}: tcpdump {drops}", file=sys.stderr)
        flows = read_flows(pcap, {up_port, px_port})
        finder = tag_finder(f"wt{mode}")
        client = exchanges(flows, px_port, finder)
        upstream = exchanges(flows, up_port, finder) if scheme == "http" else {}
        tls_flows = {tag: flows.get((port, up_port)) for tag, port in peers.items()} if scheme == "https" else {}
        holes = sum(v is None for v in client.values()) + sum(v is None for v in upstream.values())
        if holes:
            print(f"{mode}: {holes} exchanges with bytes the capture missed, left out", file=sys.stderr)
        for conc in args.concurrency:
            recorded = await rows(base, f"wt{mode}{conc}x", len(tags[conc]))
            key = (label, conc)
            results[key] = [differences(recorded[t], client.get(t), upstream.get(t), tls_flows.get(t))
                            for t in tags[conc] if t in recorded]
            sums[key] = [e for t in tags[conc] if t in recorded and (e := sum_error(recorded[t])) is not None]
            if scheme == "https":  # llmtap's own waits in the handshake, on the wire alone
                print(f"{label} c={conc}: " + lateness([tls_flows.get(t) for t in tags[conc] if t in recorded
                                                        and recorded[t].get("connection_reused") is False]),
                      file=sys.stderr)
            missing = len(tags[conc]) - len(recorded)
            if missing:
                print(f"{mode} c={conc}: {missing} rows missing", file=sys.stderr)
    finally:
        for p in spinners:
            p.kill()
        if dump is not None:
            dump.kill()
        for p in procs:
            p.terminate()
        for p in procs + spinners:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=48, help="per concurrency and mode (at most 500)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--modes", nargs="+", default=["new", "reused"], choices=["new", "reused"])
    parser.add_argument("--schemes", nargs="+", default=["http", "https"], choices=["http", "https"],
                        help="the upstream's: https runs `mock-upstream --tls` (needs trustme)")
    parser.add_argument("--spinners", type=int, default=2, help="busy processes loading the machine")
    parser.add_argument("--distance-ms", type=float, default=10, help="the upstream's hold before its headers")
    parser.add_argument("--ttft-ms", type=float, default=20)
    parser.add_argument("--itl-ms", type=float, default=2)
    parser.add_argument("--tokens", type=int, default=20)
    parser.add_argument("--code", type=Path, default=ROOT, help="the tree whose llmtap runs")
    parser.add_argument("--json", type=Path, help="also write the differences here")
    args = parser.parse_args()
    if not 0 < args.requests <= 500 or not all(0 < c <= 64 for c in args.concurrency):
        parser.error("--requests is 1 to 500, --concurrency 1 to 64: the machine is shared")
    home = Path(tempfile.mkdtemp(prefix="llmtap-wire-"))
    env = {**os.environ, "LLMTAP_HOME": str(home), "LLMTAP_CONFIG": str(home / "none.toml"),
           "LLMTAP_ADMIN_TOKEN": ADMIN["X-Llmtap-Admin-Token"]}
    results: dict[tuple[str, int], list[dict]] = {}
    sums: dict[tuple[str, int], list[float]] = {}
    for scheme in args.schemes:
        for mode in args.modes:
            await run_mode(scheme, mode, args, home, env, results, sums)
    print(f"code: {args.code}  load: {os.getloadavg()[0]:.1f}  requests per cell: {args.requests}")
    print(table(results, sums))
    if args.json:
        args.json.write_text(json.dumps({f"{m}-{c}": v for (m, c), v in results.items()}))


if __name__ == "__main__":
    asyncio.run(main())
