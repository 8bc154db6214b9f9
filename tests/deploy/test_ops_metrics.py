"""The chart's operations artefacts query only metrics the services export.

A real mesh runs sessions (one of them waits in the queue); then every metric name that the Grafana
dashboard, the PrometheusRule alerts, the worker HPA's prometheus-adapter rule and the KEDA trigger
use (read from their PromQL by tests/deploy/promql.py) must be in the services' /metrics exposition,
and so must every label value they match on exactly. A renamed metric or label value fails here.
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from inferix.client import Client, StateChanged
from inferix_cli.mesh import Mesh, start_mesh
from tests.deploy.conftest import CHART, Render, find
from tests.deploy.promql import Selector, selectors
from tests.mesh.conftest import KEY_A, mesh_config

OPS_VALUES = ("ci/ops-hpa-values.yaml", "ci/ops-keda-values.yaml")
ADAPTER_VALUES = CHART / "autoscaling" / "prometheus-adapter-values.yaml"
# Labels Prometheus gives the series of a target (and the chart's selectors match on), not the services.
TARGET_LABELS = frozenset({"namespace", "service", "pod", "job", "instance", "endpoint", "container", "cluster"})
# Series: metric name -> (labels, value) of each series exported under it.
Exposition = dict[str, list[tuple[dict[str, str], float]]]


@dataclass
class Scrapes:
    """The /metrics of every service of the mesh, twice."""

    busy: Exposition  # a session holds the worker's only real-time stream, another waits in the queue
    done: Exposition  # the first was cancelled, the second ran to its end


@pytest.fixture(scope="module")
def scrapes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scrapes]:
    """A real mesh whose one worker claims one real-time stream: an unbounded session takes it and a
    second one waits for room; then the first is cancelled and the second runs to its end."""
    mesh = start_mesh(mesh_config(tmp_path_factory.mktemp("ops"), workers=1, realtime_streams=1))
    try:
        with Client(mesh.address, api_key=KEY_A, timeout=120) as client:
            holder = client.create_session("a red ball rolling", seed=3)
            waiting = client.create_session("a blue ball waiting", num_blocks=3, seed=4, wait_for_capacity=True)
            assert waiting.state == "queued"
            busy = scrape_until(mesh, lambda s: total(s, "inferix_kvcache_stream_load") == 1)
            client.cancel_session(holder.session_id)
            states = [e.state for e in client.events(waiting.session_id) if isinstance(e, StateChanged)]
        assert states[-1] == "completed", states
        yield Scrapes(busy, scrape(mesh))
    finally:
        codes = mesh.stop()
    assert all(code == 0 for code in codes.values()), codes


def scrape_until(mesh: Mesh, ready: Callable[[Exposition], bool], timeout_s: float = 30.0) -> Exposition:
    """Scrape until `ready` (kvcache_svc recomputes its gauges every second)."""
    deadline = time.monotonic() + timeout_s
    while not ready(series := scrape(mesh)):
        assert time.monotonic() < deadline, "the metrics did not reach the expected state"
        time.sleep(0.2)
    return series


def scrape(mesh: Mesh) -> Exposition:
    series: Exposition = {}
    for process in mesh.processes():
        assert process.metrics_port, f"{process.name} serves no metrics"
        text = urllib.request.urlopen(f"http://127.0.0.1:{process.metrics_port}/metrics", timeout=10).read()
        for family in text_string_to_metric_families(text.decode()):
            for sample in family.samples:
                series.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return series


def total(series: Exposition, name: str, **labels: str) -> float:
    """The sum of the metric's series (all services) that have `labels`."""
    return sum(v for have, v in series[name] if labels.items() <= have.items())


def adapter_rule() -> dict[str, Any]:
    rules = yaml.safe_load(ADAPTER_VALUES.read_text())["rules"]["external"]
    assert len(rules) == 1, rules
    return dict(rules[0])


def adapter_queries() -> list[str]:
    """The adapter rule's queries, its <<.LabelMatchers>> as the adapter fills them (namespace, selector)."""
    rule = adapter_rule()
    matchers = 'namespace="inferix",service="inferix-metrics"'
    return [rule["seriesQuery"], rule["metricsQuery"].replace("<<.LabelMatchers>>", matchers)]


def grafana_queries(dashboard: dict[str, Any]) -> list[str]:
    """Panel targets, and the selectors inside the variables' label_values(selector, label)."""
    queries = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            match = re.fullmatch(r"label_values\((.+),\s*\w+\)", variable["query"]["query"])
            assert match, variable["query"]
            queries.append(match.group(1))
    return queries


def chart_queries(render: Render) -> dict[str, list[str]]:
    """Every PromQL query of the rendered ops artefacts, by where it comes from."""
    queries: dict[str, list[str]] = {"prometheus-adapter rule": adapter_queries()}
    for values in OPS_VALUES:
        manifests = render(values)
        rules = find(manifests, "PrometheusRule", "inferix")
        queries[f"{values}: alerts"] = [r["expr"] for g in rules["spec"]["groups"] for r in g["rules"]]
        dashboard = json.loads(find(manifests, "ConfigMap", "-dashboard")["data"]["inferix.json"])
        queries[f"{values}: dashboard"] = grafana_queries(dashboard)
    keda = find(render("ci/ops-keda-values.yaml"), "ScaledObject", "-worker")
    queries["KEDA trigger"] = [t["metadata"]["query"] for t in keda["spec"]["triggers"]]
    return queries


def missing(selector: Selector, series: Exposition) -> str | None:
    """Why `selector` matches nothing the services export (None: it does)."""
    if selector.metric not in series:
        return f"metric {selector.metric} is not exported"
    for m in selector.matchers:
        exact = m.op == "=" and m.label not in TARGET_LABELS
        if exact and not any(labels.get(m.label) == m.value for labels, _ in series[selector.metric]):
            return f"no series {selector.metric}{{{m.label}={m.value!r}}} is exported"
    return None


def test_every_metric_the_ops_artefacts_use_is_exported(scrapes: Scrapes, render: Render) -> None:
    problems = []
    used: set[str] = set()
    for where, queries in chart_queries(render).items():
        assert queries, f"{where}: no queries found"
        for query in queries:
            for selector in selectors(query):
                used.add(selector.metric)
                why = missing(selector, scrapes.done)
                if why:
                    problems.append(f"{where}: {why} (in {query!r})")
    assert not problems, "\n".join(problems)
    # Histograms are used through their real series names (x_bucket / x_sum), never the bare family name.
    assert {"inferix_block_latency_seconds_bucket", "inferix_worker_block_seconds_sum"} <= used


def test_the_hpa_scales_on_the_adapter_rule_and_keda_runs_its_query(render: Render) -> None:
    rule = adapter_rule()
    hpa = find(render("ci/ops-hpa-values.yaml"), "HorizontalPodAutoscaler", "-worker")
    [metric] = hpa["spec"]["metrics"]
    assert metric["external"]["metric"]["name"] == rule["name"]["as"]
    keda = find(render("ci/ops-keda-values.yaml"), "ScaledObject", "-worker")
    [trigger] = keda["spec"]["triggers"]
    assert trigger["metadata"]["query"] == rule["metricsQuery"].replace(
        "<<.LabelMatchers>>", 'cluster="gpu-east",job="inferix-metrics"'
    )


def test_the_autoscaler_inputs_see_the_waiting_session(scrapes: Scrapes) -> None:
    """What inferix_worker_demand adds up: the alive worker's streams all in use, one session queued
    (refused for want of real-time streams), and its wait, which InferixQueueWaiting watches."""
    busy = scrapes.busy
    assert total(busy, "inferix_kvcache_workers_alive") == 1
    assert total(busy, "inferix_kvcache_stream_load") == 1
    assert total(busy, "inferix_sessions", state="queued") == 1
    assert total(busy, "inferix_session_queue_oldest_seconds") > 0
    assert total(busy, "inferix_kvcache_refusals_total", reason="realtime") >= 1


def test_the_sessions_are_counted(scrapes: Scrapes) -> None:
    """The series behind the real-time budget and factor saw the blocks: the scheduler's and the worker's
    video seconds per block agree (the worker may also have made the cancelled session's last block)."""
    done = scrapes.done
    made = total(done, "inferix_worker_video_seconds_total") / total(done, "inferix_worker_blocks_total")
    announced = total(done, "inferix_block_video_seconds_total") / total(done, "inferix_blocks_total")
    assert announced == pytest.approx(made) and made > 0
    assert total(done, "inferix_blocks_total") >= 3
    assert total(done, "inferix_sessions", state="queued") == 0
    assert total(done, "inferix_session_queue_oldest_seconds") == 0
    assert total(done, "inferix_session_recovery_failures_total") == 0
