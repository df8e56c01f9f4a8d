"""Shared fixtures: a real simulated upstream and the real proxy, on loopback, port 0."""

from __future__ import annotations

from pathlib import Path
import os
import ssl
import sys
from collections.abc import AsyncIterator, Iterator

import pytest

from proxy.settings.config import ServeConfig
from proxy.simulator.app import Simulator
from proxy.simulator.config import SimConfig

from .serving import RunningProxy  # the tests' composition root, as proxy/cli.py is serve's: analysis's views


# Under `faketime` with only the wall clock faked, time.sleep fails (tests/faketime_site/): patched
# here and, through PYTHONPATH, in every Python process a test starts.
if os.environ.get("FAKETIME_DONT_FAKE_MONOTONIC") == "1" and "faketime" in os.environ.get("LD_PRELOAD", ""):
    _SITE = str(Path(__file__).parent / "faketime_site")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (_SITE, os.environ.get("PYTHONPATH")) if p)
    sys.path.insert(0, _SITE)
    import sitecustomize  # noqa: F401, E402  (this folder's: the patch)

# `pytest -m unit`: the loop to run while changing the meter, its parsers, the recorder or the store
# (docs/development.md); the modules whose tests need no serve process, no browser, no load.
UNIT = {"test_sse", "test_dialects", "test_dialect_quick", "test_meter_events", "test_metering", "test_request_info",
        "test_request_kind", "test_ratelimits", "test_clients", "test_recorder", "test_store", "test_migrations",
        "test_prices", "test_layers", "test_lock"}


# `pytest -m quick -n auto`: the unit set and the relay's tests that run the proxy in the test's own process
# (no serve subprocess, no browser, no npm), a contributor's loop before pushing
QUICK = UNIT | {"test_relay", "test_body_pipe", "test_arrival", "test_breakdown", "test_faults_upstream",
                "test_faults_client", "test_fast_paths"}
MARKED = {"unit": UNIT, "quick": QUICK}


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: the `unit` extra runs without it
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: twice the cores, up to four more than them. A third of the suite's time is waiting (a
    serve starting, a simulated stream's pauses, a store's retry): with two workers on 2 cores the whole
    suite took 7-10 min at 1.3 cores busy, with four 4.5 min at 1.9."""
    cores = os.cpu_count() or 1
    return min(2 * cores, cores + 4)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """With `-m unit` or `-m quick`, the other modules are not even imported (their SDKs take seconds)."""
    wanted = MARKED.get(config.getoption("markexpr", ""))
    if wanted is not None and collection_path.suffix == ".py":
        return collection_path.stem.startswith("test_") and collection_path.stem not in wanted or None
    return None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        stem = item.module.__name__.rpartition(".")[2] if item.module is not None else ""
        for marker, modules in MARKED.items():
            if stem in modules:
                item.add_marker(marker)


@pytest.fixture(autouse=True, scope="session")
def worker_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A data directory and no user config for this test process (a pytest-xdist worker) as a whole, so
    that a module-scoped proxy, started before llmtap_home, never shares the user's or another worker's."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LLMTAP_HOME", str(tmp_path_factory.mktemp("worker-home")))
        patch.setenv("LLMTAP_CONFIG", str(tmp_path_factory.getbasetemp() / "no-config.toml"))
        patch.delenv("LLMTAP_DB", raising=False)
        yield


@pytest.fixture(autouse=True)
def llmtap_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own data directory and no user config."""
    home = tmp_path / "llmtap-home"
    monkeypatch.setenv("LLMTAP_HOME", str(home))
    monkeypatch.setenv("LLMTAP_CONFIG", str(tmp_path / "no-config.toml"))
    monkeypatch.delenv("LLMTAP_DB", raising=False)
    # s3fs's botocore: never the instance-metadata address, never the developer's own AWS profiles
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy",
                "NO_PROXY", "no_proxy", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS"):
        monkeypatch.delenv(var, raising=False)
    return home


@pytest.fixture
async def sim() -> AsyncIterator[Simulator]:
    async with Simulator(SimConfig(ttft_ms=20, itl_ms=2, tokens=8, prefill_us_per_token=0)) as s:
        yield s


def proxy_config(upstream: str, tmp_path: Path, **overrides: object) -> ServeConfig:
    values: dict[str, object] = {"port": 0, "upstream": upstream, "db": str(tmp_path / "llmtap.duckdb"),
                                 "quiet": True, "flush_interval_s": 0.2}
    values.update(overrides)
    return ServeConfig(**values)  # type: ignore[arg-type]


@pytest.fixture
async def proxy(sim: Simulator, tmp_path: Path) -> AsyncIterator[RunningProxy]:
    async with RunningProxy(proxy_config(sim.url, tmp_path)) as p:
        yield p


def rows(p: RunningProxy, sql: str = "SELECT * FROM requests ORDER BY started_at") -> list[dict]:
    """Flush the proxy's store and return the query's rows as dicts."""
    assert p.store is not None
    assert p.flush(10)
    columns, _types, data = p.store.query(sql)
    return [dict(zip(columns, r)) for r in data]


@pytest.fixture
def tls(tmp_path: Path) -> Iterator[tuple[ssl.SSLContext, Path]]:
    """A private CA's server context for 127.0.0.1 and localhost, and its CA file (trustme)."""
    trustme = pytest.importorskip("trustme")
    ca = trustme.CA()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1", "localhost").configure_cert(context)
    path = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(path))
    yield context, path
