"""benchmarks/overhead.py runs end to end and reports every figure: a smoke test, not a timing check.
The benchmarks run on the real clock (`real_clock_env`): under .ci/run's faked 23:30 UTC, wrk
measures no request."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from .waiting import real_clock_env

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "overhead.py"

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


@pytest.mark.timeout(120)
def test_quick_run_reports_every_figure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One quick run with --against DIR (llmtap from the tree DIR goes through every phase and gets its own
    measuring cost): every figure in the JSON and the table, for llmtap, relay-only and the other tree."""
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    from overhead_report import REQUIRED, TARGETS

    out = tmp_path / "overhead.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--no-nginx", "--against", str(ROOT),
                           "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=100,
                          env=real_clock_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(out.read_text())
    figures = result["figures"]
    for name in REQUIRED:
        value = figures.get(name)
        assert isinstance(value, (int, float)) and math.isfinite(value), f"{name}: {value!r}"
    relay, against = result["medians"]["relay"], result["medians"]["against"]
    for name in REQUIRED:
        if name not in ("measure_cost_pct", "measure_user_us_per_chunk"):  # measuring's own figures
            assert isinstance(relay.get(name), (int, float)), f"relay {name}: {relay.get(name)!r}"
        assert isinstance(against.get(name), (int, float)) and math.isfinite(against[name]), f"{name}: {against.get(name)!r}"
    assert [c["figure"] for c in result["checks"]] == [f"{column}:{name}" for name, column, *_ in TARGETS]
    assert all(isinstance(c["pass"], bool) for c in result["checks"])
    assert not any(c["pass"] for c in result["checks"] if "nginx" in c["target"])  # no nginx: no bound
    assert "targets, against nginx, Caddy and relay-only in this run" in proc.stdout
    assert "nginx" not in result["medians"]
    for name in REQUIRED[:5]:  # the table has a row for each figure
        assert f"{figures[name]:+.2f}" in proc.stdout or f"{figures[name]:+,.0f}" in proc.stdout
    assert result["machine"]["against"] == str(ROOT)
    assert "llmtap --against" in proc.stdout


@pytest.mark.timeout(90)
def test_paired_cost_runs_both_proxies_side_by_side() -> None:
    """benchmarks/paired_cost.py, one tiny round with the aiohttp loader (wrk may be absent), with another
    tree's llmtap beside them."""
    proc = subprocess.run([sys.executable, str(SCRIPT.with_name("paired_cost.py")), "--rounds", "1", "--seconds", "1",
                           "--connections", "4", "--loader", "aiohttp", "--against", str(ROOT)],
                          cwd=ROOT, capture_output=True, text=True, timeout=80, env=real_clock_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = {line.split()[0]: line.split() for line in proc.stdout.splitlines() if line.strip()}
    llmtap, relay, measuring, cost = (float(v.rstrip("%")) for v in lines["1"][1:5])
    assert llmtap > 0 and relay > 0, proc.stdout
    assert measuring == pytest.approx(llmtap - relay, abs=0.2)
    assert cost == pytest.approx(100 * (1 - relay / llmtap), abs=0.2)
    assert lines["median"][1:5] == lines["1"][1:5]  # one round: its own median
    assert "against µs/req" in proc.stdout, proc.stdout
