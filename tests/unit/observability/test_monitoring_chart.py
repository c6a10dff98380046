"""templates/monitoring.yaml renders the alert rules, dashboards and monitors from the files
the other tests check, off by default, and selects what the operator really creates."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from mpjob.builders.attempt import labels as attempt_labels
from mpjob.controller import exposition
from mpjob.controller.config import OperatorConfig
from mpjob_contract.metrics import PRECISION_CHANGE_LABELS
from tests.unit.observability.promtool import DASHBOARDS, REPO, RULES, promtool

pytestmark = pytest.mark.unit

CHART = REPO / "helm/mpjob"
ALL_ON = [
    "monitoring.prometheusRule.enabled=true",
    "monitoring.dashboards.enabled=true",
    "monitoring.serviceMonitor.enabled=true",
    "monitoring.podMonitor.enabled=true",
]


@pytest.fixture(scope="module")
def helm() -> str:
    found = shutil.which("helm")
    if found:
        return found
    try:
        from tests.cluster.controlplane import binaries

        path = binaries() / "helm"
        if path.exists():
            return str(path)
    except Exception as exc:  # no cached build and no way to build one here
        reason = f"helm not on PATH and the test cluster's helm is unavailable ({exc})"
    else:
        reason = "helm not on PATH nor in the test cluster's binaries"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(reason)
    pytest.skip(reason)


def render(helm: str, *sets: str, release: str = "r") -> list[dict[str, Any]]:
    args = [helm, "template", release, str(CHART), "--namespace", "mpjob-system"]
    for item in sets:
        args += ["--set", item]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


def of_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


MONITORING_KINDS = ("PrometheusRule", "ServiceMonitor", "PodMonitor")


def test_monitoring_is_off_by_default(helm: str) -> None:
    docs = render(helm)
    assert not [d for d in docs if d["kind"] in MONITORING_KINDS]
    assert not [d for d in of_kind(docs, "ConfigMap") if "grafana_dashboard" in d["metadata"].get("labels", {})]


def test_prometheus_rule_is_the_rule_file(helm: str) -> None:
    (rule,) = of_kind(render(helm, *ALL_ON), "PrometheusRule")
    assert rule["spec"] == yaml.safe_load(RULES.read_text())


def test_runbook_base_url_is_configurable(helm: str) -> None:
    base = "https://git.example.com/mpjob/blob/main/docs/runbooks"
    (rule,) = of_kind(render(helm, *ALL_ON, f"monitoring.prometheusRule.runbookBaseURL={base}/"), "PrometheusRule")
    alerts = [r for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r]
    assert alerts and all(r["annotations"]["runbook_url"] == f"{base}/{r['alert']}.md" for r in alerts)
    # The alert templates reach Prometheus untouched by helm.
    assert "{{ $labels.namespace }}" in alerts[0]["annotations"]["description"]


def test_each_dashboard_is_a_sidecar_configmap_with_the_json(helm: str) -> None:
    maps = {
        name: cm
        for cm in of_kind(render(helm, *ALL_ON), "ConfigMap")
        for name in cm.get("data", {})
        if cm["metadata"]["labels"].get("grafana_dashboard") == "1"
    }
    assert set(maps) == {p.name for p in DASHBOARDS.glob("*.json")} == {"executive.json", "oncall.json", "debug.json"}
    for name, cm in maps.items():
        assert json.loads(cm["data"][name]) == json.loads((DASHBOARDS / name).read_text())


def test_service_monitor_selects_the_metrics_service_as_job_mpjob_operator(helm: str) -> None:
    docs = render(helm, *ALL_ON)
    (monitor,) = of_kind(docs, "ServiceMonitor")
    services = [s for s in of_kind(docs, "Service") if any(p["name"] == "metrics" for p in s["spec"]["ports"])]
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert [s for s in services if selector.items() <= s["metadata"]["labels"].items()]
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == "metrics"
    assert {"targetLabel": "job", "replacement": "mpjob-operator"} in endpoint["relabelings"]
    # Without the Service it would select nothing, and the operator would go unscraped.
    args = [helm, "template", "r", str(CHART), "--set", ALL_ON[2], "--set", "metrics.service.enabled=false"]
    refused = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
    assert refused.returncode != 0 and "metrics.service.enabled" in refused.stderr


def restarts_query() -> str:
    board = json.loads((DASHBOARDS / "oncall.json").read_text())
    targets = [t for p in board["panels"] for t in p.get("targets", [])]
    (expr,) = [t["expr"] for t in targets if "kube_pod_container_status_restarts_total" in t["expr"]]
    return expr


@pytest.mark.parametrize("release", ["mpjob", "r"])  # `helm install mpjob` names its pods mpjob-<hash>-...
def test_the_oncall_boards_operator_restarts_are_the_restarts_of_the_charts_operator_pods(
    helm: str, release: str, tmp_path: Path
) -> None:
    docs = render(helm, *ALL_ON, release=release)
    (deployment,) = of_kind(docs, "Deployment")
    pod = f"{deployment['metadata']['name']}-5f7b9c6d8d-x2x7q"  # a pod of its ReplicaSet
    (service,) = [s for s in of_kind(docs, "Service") if any(p["name"] == "metrics" for p in s["spec"]["ports"])]
    # As Prometheus has them: kube-state-metrics' restarts of every pod, and the operator's
    # scrape target (the ServiceMonitor relabels its job) with the pod it reached.
    restarts = 'kube_pod_container_status_restarts_total{{namespace="{}",pod="{}",container="c"}}'
    target = f'up{{job="mpjob-operator",namespace="mpjob-system",pod="{pod}",service="{service["metadata"]["name"]}"}}'
    series = [
        {"series": restarts.format("mpjob-system", pod), "values": "0 0 0 1 1 1 2 2 2 2 2"},
        {"series": restarts.format("team-a", f"{release}-gpt-a0-0-abcde"), "values": "0 1 2 3 4 5 6 7 8 9 9"},
        {"series": restarts.format("mpjob-system", "other-6c8d7-q2w3e"), "values": "0 0 5 5 5 5 5 5 5 5 5"},
        {"series": target, "values": "1 0 0 1 1 0 1 1 1 1 1"},  # its restarts counted while it is down too
    ]
    check = {"expr": restarts_query(), "eval_time": "10m", "exp_samples": [{"labels": "{}", "value": 2}]}
    test = {"interval": "1m", "input_series": series, "promql_expr_test": [check]}
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": []}))
    (tmp_path / "test.yaml").write_text(yaml.safe_dump({"rule_files": ["rules.yaml"], "tests": [test]}))
    result = promtool("test", "rules", "test.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_pod_monitor_selects_rank0_trainer_pods(helm: str) -> None:
    (monitor,) = of_kind(render(helm, *ALL_ON), "PodMonitor")
    selector = dict(monitor["spec"]["selector"]["matchLabels"])
    assert selector.pop("batch.kubernetes.io/job-completion-index") == "0"
    assert selector.items() <= attempt_labels("gpt", 0, "fp16").items(), "labels the operator puts on attempt pods"
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == "metrics"
    assert monitor["spec"]["namespaceSelector"] == {"any": True}


def test_a_trainers_series_carry_its_pods_job_and_namespace_never_its_own_word(helm: str) -> None:
    """A trainer runs the tenant's code: the labels that say whose a series is come from the pod
    (its namespace, its mpjob.dev/job label), and only the trainer's own metric names are kept,
    so no job writes series under another namespace's job or the operator's names."""
    (monitor,) = of_kind(render(helm, *ALL_ON), "PodMonitor")
    job_label = monitor["spec"]["jobLabel"]
    assert attempt_labels("gpt", 0, "fp16")[job_label] == "gpt"
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["honorLabels"] is False
    keep, drop = endpoint["metricRelabelings"]
    assert keep == {"sourceLabels": ["__name__"], "regex": "mpjob_trainer_.+", "action": "keep"}
    assert drop == {"regex": "exported_(job|namespace)", "action": "labeldrop"}


def test_prometheus_reads_a_trainer_no_further_than_the_operator_does(helm: str) -> None:
    """What a trainer serves is the tenant's word, and the cluster's Prometheus is shared: each
    scrape is bounded as the operator's own read is (`controller/scrape.py`, `exposition.py`),
    so no job can fill Prometheus' memory with a huge body or its storage with a series bomb,
    while everything the trainer writes still fits."""
    (monitor,) = of_kind(render(helm, *ALL_ON), "PodMonitor")
    spec = monitor["spec"]
    assert spec["sampleLimit"] == exposition.MAX_SAMPLES
    assert spec["labelValueLengthLimit"] == exposition.MAX_LINE
    assert spec["bodySizeLimit"] == "1MiB" and OperatorConfig().scrape_max_bytes == 1 << 20
    # The trainer's longest label set (a precision change) and the labels Prometheus adds.
    assert len(PRECISION_CHANGE_LABELS) + 4 + 8 <= spec["labelLimit"] <= 64
    bigger = ["monitoring.podMonitor.sampleLimit=2000000", "monitoring.podMonitor.bodySizeLimit=4MiB"]
    (monitor,) = of_kind(render(helm, *ALL_ON, *bigger), "PodMonitor")
    assert (monitor["spec"]["sampleLimit"], monitor["spec"]["bodySizeLimit"]) == (2_000_000, "4MiB")


def test_pod_monitor_follows_watch_namespaces(helm: str) -> None:
    (monitor,) = of_kind(render(helm, *ALL_ON, "watchNamespaces={team-a,team-b}"), "PodMonitor")
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["team-a", "team-b"]}


def test_extra_labels_reach_the_prometheus_operator_selectors(helm: str) -> None:
    docs = render(helm, *ALL_ON, *(f"monitoring.{k}.labels.release=kps" for k in ("prometheusRule", "serviceMonitor")))
    for kind in ("PrometheusRule", "ServiceMonitor"):
        (doc,) = of_kind(docs, kind)
        assert doc["metadata"]["labels"]["release"] == "kps"
