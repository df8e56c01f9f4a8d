"""benchmarks/ttft_accuracy.py runs end to end and reports every figure: a smoke test, not a timing
check. Its aiperf mode is checked on records shaped like aiperf's (and, with LLMTAP_AIPERF set to an
aiperf executable, with the real one: `-m slow`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "ttft_accuracy.py"


@pytest.mark.timeout(90)
def test_own_client_reports_the_difference() -> None:
    proc = subprocess.run([sys.executable, str(SCRIPT), "--requests", "6", "--concurrency", "2", "--ttft-ms", "10",
                           "--itl-ms", "2", "--tokens", "3"], cwd=ROOT, capture_output=True, text=True, timeout=80)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "6 of 6 requests matched" in proc.stdout
    assert "client − recorded TTFT: median" in proc.stdout
    assert "proxy event-loop lag:" in proc.stdout


def _record(start_ns: int, ttft: float, latency: float, tokens: int) -> dict:
    itl = (latency - ttft) / (tokens - 1)
    return {"metadata": {"request_start_ns": start_ns, "benchmark_phase": "profiling"},
            "metrics": {"time_to_first_token": {"value": ttft}, "request_latency": {"value": latency},
                        "output_token_count": {"value": tokens}, "inter_token_latency": {"value": itl},
                        "inter_chunk_latency": {"value": [itl] * (tokens - 1)}},
            "trace_data": {"request_send_end_ns": start_ns + 300_000}}


def test_aiperf_records_matched_and_compared(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    import ttft_accuracy

    t0 = 1_800_000_000 * 10**9
    records = [_record(t0 + i * 10**9, 201.0, 1181.0, 50) for i in range(4)]
    # llmtap's rows: started a few ms after aiperf's start, its clock 0.5 ms later; plus a warm-up row
    rows = [[(t0 + i * 10**9) / 1000 + 3000, 200.5, 1180.5, 20.0, 20.0, 50, 1180.5, 200] for i in range(4)]
    rows.append([(t0 - 5 * 10**9) / 1000, 200.0, 1180.0, 20.0, 20.0, 50, 1180.0, 200])
    pairs = ttft_accuracy.match(records, rows)
    assert len(pairs) == 4 and all(row["started_us"] >= t0 / 1000 for _, row in pairs)
    assert ttft_accuracy.compare(pairs, 4, 1)
    out = capsys.readouterr().out
    assert "4 of 4 aiperf requests matched" in out
    assert "aiperf − llmtap TTFT: median 0.500 ms" in out
    assert "output tokens equal: 4 of 4" in out
    assert "TTFT p50 within 1 ms: PASS" in out


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.skipif(not os.environ.get("LLMTAP_AIPERF"), reason="LLMTAP_AIPERF names no aiperf executable")
def test_with_aiperf() -> None:
    proc = subprocess.run([sys.executable, str(SCRIPT), "--aiperf", os.environ["LLMTAP_AIPERF"], "--requests", "10",
                           "--ttft-ms", "20", "--itl-ms", "2", "--tokens", "10"],
                          cwd=ROOT, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "10 of 10 aiperf requests matched" in proc.stdout
    assert "output tokens equal: 10 of 10" in proc.stdout
    assert "TTFT p50 within 1 ms: " in proc.stdout
