"""The deployment files: compose, Dockerfile, Prometheus and Grafana config (no Docker daemon needed).

The dashboard's PromQL is checked against the scrape that PrometheusMetrics
produces after real requests through the real proxy: every metric, label and
exact label value it names must be there.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml")

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from proxy.record.recorder import on_rows  # noqa: E402
from proxy.observe.metrics import PrometheusMetrics  # noqa: E402
from .serving import RunningProxy  # noqa: E402

from .test_metrics import MESSAGES, MIX, send_mix  # noqa: E402
from .waiting import wait_until  # noqa: E402

# a priced model on an API key and on a Claude login: the cost counter and the limit gauges have samples
PRICED_AND_LIMITED = [
    ("POST", "/v1/messages", {**MESSAGES, "model": "claude-haiku-4-5"}, {"x-api-key": "sk-ant-api03-sim"}),
    ("POST", "/v1/messages", {**MESSAGES, "model": "claude-haiku-4-5"}, {"authorization": "Bearer sk-ant-oat01-sim"}),
]

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "deploy/grafana/dashboards/llmtap.json"
ADDED_BY_PROMETHEUS = {"instance", "job"}
NOT_METRICS = {"by", "without", "and", "or", "unless", "bool", "offset", "on", "ignoring", "group_left",
               "group_right", "inf", "nan"}


def load_yaml(path: str) -> Any:
    return yaml.safe_load((ROOT / path).read_text())


def compose() -> dict[str, Any]:
    return load_yaml("docker-compose.yml")


def test_compose_services_volumes_and_env() -> None:
    doc = compose()
    assert set(doc["services"]) == {"llmtap", "prometheus", "grafana"}
    llmtap = doc["services"]["llmtap"]
    command = " ".join(llmtap["command"])
    assert llmtap["command"][0] == "serve"
    for flag in ("--host=0.0.0.0", "--allow-remote", "--upstream=${LLMTAP_UPSTREAM:?"):
        assert flag in command, flag
    assert "admin-token" not in command  # a command line is every user's to read
    assert llmtap["environment"]["LLMTAP_ADMIN_TOKEN"].startswith("${LLMTAP_ADMIN_TOKEN:?")
    assert "llmtap-data:/data" in llmtap["volumes"]
    assert set(doc["volumes"]) == {"llmtap-data", "prometheus-data", "grafana-data"}
    for name, service in doc["services"].items():
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), f"{name} publishes {port} beyond loopback"
    assert doc["secrets"]["llmtap_admin_token"]["environment"] == "LLMTAP_ADMIN_TOKEN"
    assert doc["services"]["prometheus"]["secrets"] == ["llmtap_admin_token"]


def test_compose_mounts_files_that_exist() -> None:
    for name, service in compose()["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (ROOT / source).exists(), f"{name} mounts missing {source}"


def test_dockerfile_runs_as_a_non_root_user_with_data_on_a_volume() -> None:
    lines = [line.strip() for line in (ROOT / "Dockerfile").read_text().splitlines()]
    users = [line.split()[1] for line in lines if line.startswith("USER ")]
    assert users and users[-1] not in ("root", "0"), users
    assert lines.index(f"USER {users[-1]}") > max(i for i, line in enumerate(lines) if line.startswith("RUN "))
    assert "ENV LLMTAP_HOME=/data" in lines and "VOLUME /data" in lines
    for line in lines:
        if line.startswith("COPY "):
            for source in line.split()[1:-1]:
                assert (ROOT / source).exists(), source
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert "*.duckdb" in ignored and ".git" in ignored


def test_prometheus_scrapes_the_admin_endpoint_with_the_token() -> None:
    doc = load_yaml("deploy/prometheus.yml")
    (job,) = [j for j in doc["scrape_configs"] if j["job_name"] == "llmtap"]
    assert job["metrics_path"] == "/_llmtap/metrics"
    assert job["authorization"]["type"] == "Bearer"
    assert job["authorization"]["credentials_file"] == "/run/secrets/llmtap_admin_token"  # the compose secret
    assert job["static_configs"][0]["targets"] == ["llmtap:8787"]  # the compose service and port
    mounts = compose()["services"]["prometheus"]["volumes"]
    assert "./deploy/prometheus.yml:/etc/prometheus/prometheus.yml:ro" in mounts


def test_grafana_provisioning() -> None:
    datasource = load_yaml("deploy/grafana/provisioning/datasources/prometheus.yml")["datasources"][0]
    assert datasource["type"] == "prometheus" and datasource["url"] == "http://prometheus:9090"
    provider = load_yaml("deploy/grafana/provisioning/dashboards/llmtap.yml")["providers"][0]
    mounts = compose()["services"]["grafana"]["volumes"]
    assert f"./deploy/grafana/dashboards:{provider['options']['path']}:ro" in mounts
    dashboard = json.loads(DASHBOARD.read_text())
    uids = {p["datasource"]["uid"] for p in dashboard["panels"] if "datasource" in p}
    assert uids == {datasource["uid"]}
    titles = " ".join(p["title"] for p in dashboard["panels"])
    for topic in ("TTFT", "TPOT", "E2E", "Tokens", "Error"):
        assert topic in titles


def expressions() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    exprs += [v["definition"] for v in dashboard["templating"]["list"]]
    return exprs


def promql_parts(expr: str) -> tuple[set[str], set[str], set[tuple[str, str]]]:
    """Metric names, label names, and (label, value) of exact `=` matchers in one expression."""
    exact = set(re.findall(r'(\w+)\s*=\s*"([^"$]*)"', expr))
    labels = {name for name, _ in re.findall(r'(\w+)\s*(=~|!=|!~|=)\s*"', expr)}
    for group in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr):
        labels |= {g.strip() for g in group.split(",") if g.strip()}
    if m := re.match(r"label_values\((\w+),\s*(\w+)\)", expr):
        return {m.group(1)}, {m.group(2)}, set()
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}|\[[^\]]*\]|\b(?:by|without)\s*\([^)]*\)", " ", text)
    names = {m for m in re.findall(r"(?<![\w.])([a-zA-Z_:][\w:]*)(?![\w:])(?!\s*\()", text)} - NOT_METRICS
    return names, labels, exact


async def test_every_dashboard_query_names_what_the_scrape_has(proxy: RunningProxy) -> None:
    metrics = PrometheusMetrics(store_stats=proxy.store.stats, loop_lag=proxy.state.loop_lag.summary)
    proxy.state.recorder.observe(on_rows(metrics.observe))
    await send_mix(proxy, [*MIX, *PRICED_AND_LIMITED])
    # the lag gauge appears once the loop has been measured
    await wait_until(lambda: proxy.state.loop_lag.samples, what="a loop lag sample")
    scrape = [s for f in text_string_to_metric_families(metrics.render()[0].decode()) for s in f.samples]
    names = {s.name for s in scrape}
    labels = {k for s in scrape for k in s.labels} | ADDED_BY_PROMETHEUS
    values = {(k, v) for s in scrape for k, v in s.labels.items()}
    checked = 0
    for expr in expressions():
        used, used_labels, exact = promql_parts(expr)
        assert used, expr
        assert used <= names, (expr, used - names)
        assert used_labels <= labels, (expr, used_labels - labels)
        assert exact <= values, (expr, exact - values)
        checked += 1
    assert checked >= 12


def test_the_promql_reader_itself() -> None:
    names, labels, exact = promql_parts(
        'histogram_quantile(0.95, sum by (le, model) (rate(a_bucket{model=~"$m", status_class="2xx"}[5m])))'
        ' / clamp_min(b_total, 1e-9)')
    assert names == {"a_bucket", "b_total"}
    assert labels == {"le", "model", "status_class"}
    assert exact == {("status_class", "2xx")}
