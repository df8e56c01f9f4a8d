"""benchmarks/overhead.py runs end to end and reports every figure: a smoke test, not a timing check."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "overhead.py"

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


@pytest.mark.timeout(90)
def test_quick_run_reports_every_figure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    from overhead_report import REQUIRED, TARGETS

    out = tmp_path / "overhead.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--no-nginx", "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(out.read_text())
    figures = result["figures"]
    for name in REQUIRED:
        value = figures.get(name)
        assert isinstance(value, (int, float)) and math.isfinite(value), f"{name}: {value!r}"
    relay = result["medians"]["relay"]
    for name in REQUIRED:
        if name != "measure_cost_pct":
            assert isinstance(relay.get(name), (int, float)), f"relay {name}: {relay.get(name)!r}"
    assert {c["figure"] for c in result["checks"]} == {name for name, *_ in TARGETS}
    assert all(isinstance(c["pass"], bool) for c in result["checks"])
    assert "nginx" not in result["medians"]
    for name in REQUIRED[:5]:  # the table has a row for each figure
        assert f"{figures[name]:+.2f}" in proc.stdout or f"{figures[name]:+,.0f}" in proc.stdout
