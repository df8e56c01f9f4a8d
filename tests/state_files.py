"""The state file of one `llmtap serve`, found by its pid: how tests and benchmarks learn the address
a proxy started on port 0 took (proxy/common/instances.py reads and writes the files)."""

from __future__ import annotations

from pathlib import Path

from proxy.common import paths
from proxy.common.instances import State, read_state


def state_of(pid: int, data_dir: Path | None = None) -> State | None:
    """The state file of the `llmtap serve` with this pid (in `data_dir`, default this account's)."""
    directory = data_dir / "run" if data_dir is not None else paths.state_dir()
    try:
        files = list(directory.glob("*.json"))
    except OSError:
        return None
    return next((s for s in map(read_state, files) if s is not None and s.pid == pid), None)
