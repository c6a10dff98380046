"""The Helm chart: lint, CRD drift, what the operator Deployment runs, least-privilege RBAC
that still covers every API call the operator makes, peering, the `helm test` hook."""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from mpjob.controller.config import from_environment
from mpjob.crd import crd_yaml
from mpjob_contract.api import MixedPrecisionJob

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm/mpjob"
OPERATOR = REPO / "operator/mpjob/controller"


@pytest.fixture(scope="module")
def helm() -> str:
    found = os.environ.get("MPJOB_HELM") or shutil.which("helm")
    if not found:
        cached = sorted(Path.home().glob(".cache/mpjob/cluster/*/bin/helm"))
        found = str(cached[-1]) if cached else None
    if not found:
        message = "helm not on PATH nor in the test cluster's binaries (bash tests/cluster/build.sh)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    return found


def render(helm: str, *sets: str, namespace: str = "mpjob-system") -> list[dict[str, Any]]:
    args = [helm, "template", "r", str(CHART), "--namespace", namespace]
    for item in sets:
        args += ["--set", item]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def render_error(helm: str, *sets: str) -> str:
    args = [helm, "template", "r", str(CHART)]
    for item in sets:
        args += ["--set", item]
    result = subprocess.run(args, capture_output=True, text=True)
    assert result.returncode != 0, "the chart rendered"
    return result.stderr


def of_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def operator_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (deployment,) = of_kind(docs, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def arg(container: dict[str, Any], flag: str) -> list[str]:
    return [a.split("=", 1)[1] for a in container["args"] if a.startswith(flag + "=")]


# ------------------------------------------------------------------ chart files


def test_helm_lint_is_clean(helm: str) -> None:
    for sets in ([], ["watchNamespaces={a,b}", "peering.enabled=true"]):
        cmd = [helm, "lint", "--strict", str(CHART)] + [x for s in sets for x in ("--set", s)]
        result = subprocess.run(cmd, capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "[WARNING]" not in result.stdout and "[ERROR]" not in result.stdout


def test_chart_pins_app_version_and_kubernetes_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == "0.1.0"
    assert chart["kubeVersion"] == ">=1.29.0-0"


def test_chart_crd_is_the_generated_crd() -> None:
    chart_crd = (CHART / "crds/mixedprecisionjobs.mpjob.dev.yaml").read_text()
    assert chart_crd == (REPO / "crds/mixedprecisionjobs.mpjob.dev.yaml").read_text(), "run `mpjob crd --write`"
    assert chart_crd == crd_yaml(), "run `mpjob crd --write`"


def test_values_outside_the_schema_are_rejected(helm: str) -> None:
    assert "additional properties 'replicas' not allowed" in render_error(helm, "replicas=2")
    assert "readOnlyRootFilesystem" in render_error(helm, "securityContext.readOnlyRootFilesystem=false")
    assert "watchNamespaces" in render_error(helm, "watchNamespaces={Not_A_Namespace}")
    assert "watchNamespaces" in render_error(helm, "watchNamespaces={a,a}")
    for seconds in ("-1", "361"):  # the operator's --attempt-backoff-seconds allows 0 to 360
        assert "attemptBackoffSeconds" in render_error(helm, f"operator.attemptBackoffSeconds={seconds}")


# ------------------------------------------------------------------ the operator Deployment


def test_deployment_runs_mpjob_operator_with_an_explicit_command(helm: str) -> None:
    docs = render(helm)
    ctr = operator_container(docs)
    # The node agent (and any runtime) runs what the pod says, not the image's ENTRYPOINT.
    assert ctr["command"] == ["mpjob", "operator"]
    assert ctr["image"] == "mpjob-operator:0.1.0"
    assert not arg(ctr, "--namespace")  # cluster-wide by default
    assert not arg(ctr, "--peering")
    assert arg(ctr, "--attempt-backoff-seconds") == ["10"]  # the Kubernetes Job controller's first wait
    env = {e["name"]: e for e in ctr["env"]}
    assert env["MPJOB_TRAINER_IMAGE"]["value"] == "mpjob-trainer:0.1.0"
    assert env["POD_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert "MPJOB_TRAINER_COMMAND" not in env


def test_values_reach_the_operator(helm: str) -> None:
    docs = render(
        helm,
        "image.tag=9.9.9",
        "trainerImage=registry.example/trainer:1",
        "operator.metricsPort=9100",
        "operator.healthPort=9101",
        "operator.tickSeconds=2",
        "operator.attemptBackoffSeconds=3",
        "operator.trainerCommand={python,-m,mpjob_trainer}",
    )
    ctr = operator_container(docs)
    assert ctr["image"] == "mpjob-operator:9.9.9"
    env = {e["name"]: e.get("value") for e in ctr["env"]}
    assert env["MPJOB_TRAINER_IMAGE"] == "registry.example/trainer:1"
    assert env["MPJOB_TRAINER_COMMAND"] == '["python","-m","mpjob_trainer"]'
    assert arg(ctr, "--metrics-port") == ["9100"] and arg(ctr, "--health-port") == ["9101"]
    assert arg(ctr, "--tick-seconds") == ["2"]
    assert arg(ctr, "--attempt-backoff-seconds") == ["3"]
    ports = {p["name"]: p["containerPort"] for p in ctr["ports"]}
    assert ports == {"metrics": 9100, "health": 9101}
    for probe in ("livenessProbe", "readinessProbe"):
        assert ctr[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    (service,) = of_kind(docs, "Service")
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"


def test_operator_pod_is_locked_down(helm: str) -> None:
    docs = render(helm)
    (deployment,) = of_kind(docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    ctr = operator_container(docs)
    sc = ctr["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"] and "add" not in sc["capabilities"]
    assert sc["seccompProfile"]["type"] == "RuntimeDefault"
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] > 0
    assert ctr["resources"]["requests"] and ctr["resources"]["limits"]["memory"]
    # A read-only root needs a writable /tmp for anything that wants one.
    assert {"name": "tmp", "mountPath": "/tmp"} in ctr["volumeMounts"]
    # The operator's ServiceAccount mounts no token anywhere but in the operator pod.
    (sa,) = [d for d in of_kind(docs, "ServiceAccount") if "helm.sh/hook" not in d["metadata"].get("annotations", {})]
    assert sa["automountServiceAccountToken"] is False and pod["automountServiceAccountToken"] is True
    assert pod["serviceAccountName"] == sa["metadata"]["name"]


def test_standalone_operator_is_never_two_at_once(helm: str) -> None:
    (deployment,) = of_kind(render(helm), "Deployment")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert "replicaCount > 1 needs peering.enabled=true" in render_error(helm, "replicaCount=2")


def test_several_replicas_stand_by_through_kopf_peering(helm: str) -> None:
    (deployment,) = of_kind(render(helm, "replicaCount=3", "peering.enabled=true"), "Deployment")
    assert deployment["spec"]["replicas"] == 3
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    (ctr,) = deployment["spec"]["template"]["spec"]["containers"]
    assert "--peering=mpjob" in ctr["args"]


def test_changed_operator_values_roll_the_pod(helm: str) -> None:
    def checksum(*sets: str) -> str:
        (deployment,) = of_kind(render(helm, *sets), "Deployment")
        return deployment["spec"]["template"]["metadata"]["annotations"]["checksum/config"]

    assert checksum() == checksum()
    assert checksum() != checksum("operator.tickSeconds=3")
    assert checksum() != checksum("trainerImage=other:1")
    # A string whatever its digits: an unquoted "12345678" or "123e4567" is a YAML number, and the
    # API server refuses a Deployment whose annotation is not a string.
    out = subprocess.run([helm, "template", "r", str(CHART)], capture_output=True, text=True, check=True).stdout
    assert f'checksum/config: "{checksum()}"' in out


def test_peering_gives_the_peers_an_object_rbac_and_rolling_upgrades(helm: str) -> None:
    docs = render(helm, "peering.enabled=true", "peering.name=ops")
    assert arg(operator_container(docs), "--peering") == ["ops"]
    (peering,) = of_kind(docs, "ClusterKopfPeering")
    assert peering["metadata"]["name"] == "ops"
    (deployment,) = of_kind(docs, "Deployment")
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    rules = [r for d in of_kind(docs, "ClusterRole") for r in d["rules"]]
    assert {
        "apiGroups": ["kopf.dev"],
        "resources": ["clusterkopfpeerings"],
        "verbs": ["get", "list", "watch", "patch"],
    } in rules
    crds = list(yaml.safe_load_all((CHART / "crds/kopf-peerings.yaml").read_text()))
    assert {c["metadata"]["name"] for c in crds} == {"clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"}

    docs = render(helm, "peering.enabled=true", "watchNamespaces={a,b}")
    assert {(p["metadata"]["namespace"], p["metadata"]["name"]) for p in of_kind(docs, "KopfPeering")} == {
        ("a", "mpjob"),
        ("b", "mpjob"),
    }
    assert not of_kind(docs, "ClusterKopfPeering")


def test_turning_peering_on_replaces_a_standalone_operator_instead_of_rolling_beside_it(
    helm: str, tmp_path: Path
) -> None:
    """The strategy follows the Deployment running in the cluster (`lookup`, empty in `helm
    template`): a standalone operator knows no peering, so a new peered one rolled in beside it
    would act at once, and both would until it has gone."""
    chart = tmp_path / "mpjob"
    shutil.copytree(CHART, chart)
    running = '(.Files.Get "files/running.yaml" | fromYaml)'
    probe = f'{{{{ include "mpjob.rolls" (dict "peering" .Values.peering.enabled "running" {running}) }}}}'
    configmap = "kind: ConfigMap\napiVersion: v1\nmetadata: {name: rolls}\n"
    (chart / "templates/zz-rolls.yaml").write_text(configmap + f"data: {{rolls: '{probe}'}}\n")

    def rolls(running: dict[str, Any] | None, *sets: str) -> bool:
        (chart / "files/running.yaml").write_text(yaml.safe_dump(running) if running else "")
        args = [helm, "template", "r", str(chart), "--show-only", "templates/zz-rolls.yaml"]
        out = subprocess.run(args + [x for s in sets for x in ("--set", s)], capture_output=True, text=True, check=True)
        return bool(yaml.safe_load(out.stdout)["data"]["rolls"])

    (standalone,) = of_kind(render(helm), "Deployment")
    (peered,) = of_kind(render(helm, "peering.enabled=true"), "Deployment")
    assert rolls(None, "peering.enabled=true"), "a first install with peering rolls"
    assert rolls(peered, "peering.enabled=true"), "peers hand over"
    assert not rolls(standalone, "peering.enabled=true"), "the standalone operator would not stand by"
    assert not rolls(peered) and not rolls(None), "peering off: never two at once"


# ------------------------------------------------------------------ RBAC


def _api_calls() -> set[str]:
    """Kubernetes client methods the operator uses (core./batch./custom./networking./extensions.),
    called directly or handed to a helper such as `raw(batch.create_namespaced_job, ...)`."""
    source = "\n".join(p.read_text() for p in sorted(OPERATOR.glob("*.py")))
    return set(re.findall(r"\b(?:core|batch|custom|networking|extensions)\.([a-z]+_\w+)\b", source))


def _needed(method: str) -> tuple[str, str, str]:
    """(apiGroup, resource, verb) for a kubernetes-client method name."""
    verb_of = {"read": "get", "get": "get", "list": "list", "create": "create", "delete": "delete", "patch": "patch"}
    m = re.fullmatch(
        r"(read|get|list|create|delete|patch|replace)_namespaced_(\w+?)(_status)?", method
    ) or re.fullmatch(r"(list)_(\w+?)_for_all_namespaces()", method)
    assert m, f"the operator calls {method}: teach this test its RBAC verb"
    verb, kind, status = verb_of.get(m.group(1), "update"), m.group(2), m.group(3)
    group, resource = {
        "pod": ("", "pods"),
        "service": ("", "services"),
        "secret": ("", "secrets"),
        "event": ("", "events"),
        "job": ("batch", "jobs"),
        "network_policy": ("networking.k8s.io", "networkpolicies"),
        "custom_object": ("mpjob.dev", "mixedprecisionjobs"),
    }[kind]
    return group, resource + ("/status" if status else ""), verb


def _grants(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {(g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}


#: Reads of kopf's peering objects (mpjob.controller.peering), made only with peering on.
PEERING_CALLS = {"get_cluster_custom_object": ("kopf.dev", "clusterkopfpeerings", "get")}
#: The read of the installed CRD at start (mpjob.controller.crdcheck), in the cluster reader's role.
CRD_CALLS = {"read_custom_resource_definition": ("apiextensions.k8s.io", "customresourcedefinitions", "get")}
#: Reads of nodes and pods everywhere (mpjob.controller.capacity, lostnodes) and of a namespace's
#: ResourceQuotas (mpjob.controller.quotas), granted only with rbac.elasticCapacity.
ELASTIC_CALLS = {
    "list_node": ("", "nodes", "list"),
    "list_pod_for_all_namespaces": ("", "pods", "list"),
    "list_namespaced_resource_quota": ("", "resourcequotas", "list"),
}


def test_rbac_covers_every_api_call_the_operator_makes(helm: str) -> None:
    calls = _api_calls()
    peering_calls = {PEERING_CALLS[m] for m in calls & PEERING_CALLS.keys()}
    assert peering_calls, "the ticker reads the peering object (the scan works)"
    calls -= PEERING_CALLS.keys()
    assert calls & ELASTIC_CALLS.keys() == ELASTIC_CALLS.keys()  # spec.elastic's count of free GPUs
    calls -= ELASTIC_CALLS.keys()
    assert calls & CRD_CALLS.keys() == CRD_CALLS.keys()  # the installed CRD's check at start
    calls -= CRD_CALLS.keys()
    (reader,) = [d for d in of_kind(render(helm), "ClusterRole") if d["metadata"]["name"] == "r-mpjob-cluster-reader"]
    assert set(CRD_CALLS.values()) <= _grants(reader["rules"])
    assert "list_namespaced_pod" in calls and "create_namespaced_job" in calls  # the scan works
    assert "create_namespaced_network_policy" in calls
    needed = {_needed(m) for m in calls} | {
        ("mpjob.dev", "mixedprecisionjobs", "watch"),  # kopf's watch
        ("mpjob.dev", "mixedprecisionjobs", "list"),
        ("batch", "jobs", "watch"),  # the operator's cache of attempt Jobs, pods and FailedCreate Events
        ("", "pods", "watch"),
        ("", "events", "watch"),
        ("", "events", "create"),  # kopf.event
    }
    (cluster_role,) = [d for d in of_kind(render(helm), "ClusterRole") if d["metadata"]["name"] == "r-mpjob"]
    assert needed <= _grants(cluster_role["rules"])
    for role in of_kind(render(helm, "watchNamespaces={a,b}"), "Role"):
        if "helm.sh/hook" not in role["metadata"].get("annotations", {}):
            assert needed <= _grants(role["rules"])
    # With peering, the ticker reads the same peering object kopf keeps (cluster or per namespace).
    peering = render(helm, "peering.enabled=true")
    (cluster_role,) = [d for d in of_kind(peering, "ClusterRole") if d["metadata"]["name"] == "r-mpjob"]
    assert peering_calls <= _grants(cluster_role["rules"])
    for role in of_kind(render(helm, "watchNamespaces={a,b}", "peering.enabled=true"), "Role"):
        if "helm.sh/hook" not in role["metadata"].get("annotations", {}):
            assert ("kopf.dev", "kopfpeerings", "get") in _grants(role["rules"])


def test_rbac_grants_nothing_beyond_what_the_operator_uses(helm: str) -> None:
    for sets in ([], ["watchNamespaces={a}"], ["peering.enabled=true"]):
        docs = render(helm, *sets)
        # The operator's own roles (the users' roles, aggregated into edit/view, are checked below).
        roles = [d for d in of_kind(docs, "ClusterRole") + of_kind(docs, "Role") if not _aggregated(d)]
        grants = set().union(*(_grants(r["rules"]) for r in roles))
        assert not {g for g in grants if "*" in g}, "no wildcards"
        assert not {g for g in grants if g[1] in ("configmaps", "serviceaccounts", "nodes")}
        # Secrets: create only (each attempt's profile-token Secret); never read, listed or watched.
        assert {g for g in grants if g[1] == "secrets"} == {("", "secrets", "create")}
        # Pods: read, and deleted only when an attempt is cut (mpjob.planning.cutoff); never
        # created, changed or exec'd into.
        assert {g[2] for g in grants if g[1] == "pods"} <= {"list", "watch", "delete"}, "pods: read and delete only"
        assert not {g for g in grants if g[1].startswith("pods/")}, "no pods/exec, pods/log, pods/eviction"
        operator = [r for r in roles if "helm.sh/hook" not in r["metadata"].get("annotations", {})]
        # Services are created owned by their attempt's Job and go with it; deleted by name only
        # when that Job was deleted leaving them ownerless (controller/leftovers.py: a Service of
        # that name mpjob did not create stays). Never listed, watched or changed.
        services = {g for g in set().union(*(_grants(r["rules"]) for r in operator)) if g[1] == "services"}
        assert services <= {("", "services", v) for v in ("get", "create", "delete")}
        # NetworkPolicies likewise.
        policies = {g for g in set().union(*(_grants(r["rules"]) for r in operator)) if g[1] == "networkpolicies"}
        assert policies <= {("networking.k8s.io", "networkpolicies", v) for v in ("get", "create", "patch", "delete")}
        mine = {g for g in set().union(*(_grants(r["rules"]) for r in operator)) if g[0] == "mpjob.dev"}
        assert mine == {
            ("mpjob.dev", "mixedprecisionjobs", "get"),
            ("mpjob.dev", "mixedprecisionjobs", "list"),
            ("mpjob.dev", "mixedprecisionjobs", "watch"),
            ("mpjob.dev", "mixedprecisionjobs/status", "patch"),  # only the status is written
            ("mpjob.dev", "mixedprecisionjobs/finalizers", "update"),  # blockOwnerDeletion on the children
        }
        assert not {g for g in grants if g[2] in ("escalate", "bind", "impersonate", "deletecollection")}
        assert not {g for g in grants if g[1] == "customresourcedefinitions" and g[2] not in ("get", "list", "watch")}


def _aggregated(role: dict[str, Any]) -> set[str]:
    """The built-in roles this one aggregates into (rbac.authorization.k8s.io/aggregate-to-*)."""
    prefix = "rbac.authorization.k8s.io/aggregate-to-"
    labels = role["metadata"].get("labels", {})
    return {k[len(prefix) :] for k, v in labels.items() if k.startswith(prefix) and v == "true"}


def test_user_roles_aggregate_into_edit_and_view_and_grant_only_mixedprecisionjobs(helm: str) -> None:
    users = {r["metadata"]["name"]: r for r in of_kind(render(helm), "ClusterRole") if _aggregated(r)}
    edit, view = users["r-mpjob-edit"], users["r-mpjob-view"]
    assert _aggregated(edit) == {"edit", "admin"} and _aggregated(view) == {"view"}
    assert {g[0] for r in (edit, view) for g in _grants(r["rules"])} == {"mpjob.dev"}
    assert ("mpjob.dev", "mixedprecisionjobs", "create") in _grants(edit["rules"])
    assert ("mpjob.dev", "mixedprecisionjobs/status", "patch") not in _grants(edit["rules"]), "status is the operator's"
    assert {g[2] for g in _grants(view["rules"])} == {"get", "list", "watch"}
    assert not [r for r in of_kind(render(helm, "rbac.userRoles=false"), "ClusterRole") if _aggregated(r)]


def test_admission_policy_is_opt_in_and_names_the_allowlist(helm: str) -> None:
    assert not of_kind(render(helm), "ValidatingAdmissionPolicy")
    docs = render(helm, "admissionPolicy.enabled=true", "admissionPolicy.serviceAccountNames={trainer}")
    (policy,) = of_kind(docs, "ValidatingAdmissionPolicy")
    (binding,) = of_kind(docs, "ValidatingAdmissionPolicyBinding")
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    rules = " ".join(v["expression"] for v in policy["spec"]["validations"])
    assert "!has(v.hostPath)" in rules and '["trainer"]' in rules and "!has(v.emptyDir)" not in rules
    # Trainers hold no Kubernetes credentials: no token through the template either.
    assert "!has(s.serviceAccountToken)" in rules and "automountServiceAccountToken == false" in rules
    # ... nor a pod certificate (a projected podCertificate source), where the CRD is older than the chart.
    assert "!has(s.podCertificate)" in rules
    bad = render_error(helm, "admissionPolicy.serviceAccountNames={Not_A_Name}")
    assert "serviceAccountNames" in bad


def _network_policy_setting(docs: list[dict[str, Any]]) -> dict[str, Any] | None:
    env = {e["name"]: e.get("value") for e in operator_container(docs)["env"]}
    value = env.get("MPJOB_NETWORK_POLICY")
    return json.loads(value) if value is not None else None


def _operator_grants(docs: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    roles = [d for d in of_kind(docs, "ClusterRole") + of_kind(docs, "Role") if not _aggregated(d)]
    mine = [r for r in roles if "helm.sh/hook" not in r["metadata"].get("annotations", {})]
    return set().union(*(_grants(r["rules"]) for r in mine))


def test_attempt_network_policies_are_on_by_default_and_admit_the_operator(helm: str) -> None:
    docs = render(helm)
    setting = _network_policy_setting(docs)
    (deployment,) = of_kind(docs, "Deployment")
    assert setting == {
        "operatorNamespace": "mpjob-system",
        "operatorLabels": deployment["spec"]["selector"]["matchLabels"],
        "monitoringNamespaces": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
        "monitoringPods": {},
    }
    # The operator reads the chart's setting as it is written.
    readers = from_environment({"MPJOB_NETWORK_POLICY": json.dumps(setting)}).network_policy
    assert readers is not None and readers.operator_labels == deployment["spec"]["selector"]["matchLabels"]
    assert ("networking.k8s.io", "networkpolicies", "create") in _operator_grants(docs)
    for role in of_kind(render(helm, "watchNamespaces={a,b}"), "Role"):
        if "helm.sh/hook" not in role["metadata"].get("annotations", {}):
            assert ("networking.k8s.io", "networkpolicies", "create") in _grants(role["rules"])


def test_turning_network_policies_off_drops_the_setting_and_the_grant(helm: str) -> None:
    docs = render(helm, "networkPolicy.enabled=false")
    assert _network_policy_setting(docs) is None
    assert not {g for g in _operator_grants(docs) if g[1] == "networkpolicies"}


def test_who_may_read_trainer_metrics_is_configurable(helm: str) -> None:
    docs = render(
        helm,
        "networkPolicy.monitoring.namespaceSelector.matchLabels.team=observability",
        "networkPolicy.monitoring.podSelector.matchLabels.app\\.kubernetes\\.io/name=prometheus",
    )
    setting = _network_policy_setting(docs)
    assert setting is not None
    assert setting["monitoringNamespaces"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "monitoring",
        "team": "observability",
    }
    assert setting["monitoringPods"] == {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}
    only_operator = _network_policy_setting(render(helm, "networkPolicy.monitoring.namespaceSelector=null"))
    assert only_operator is not None and "monitoringNamespaces" not in only_operator
    # An empty selector is every namespace: said explicitly or not at all.
    assert "namespaceSelector" in render_error(helm, "networkPolicy.monitoring.namespaceSelector.matchLabels=null")
    empty = '{"matchLabels": null, "matchExpressions": []}'
    args = [helm, "template", "r", str(CHART), "--set-json", f"networkPolicy.monitoring.namespaceSelector={empty}"]
    refused = subprocess.run(args, capture_output=True, text=True)
    assert refused.returncode != 0
    assert "networkPolicy.monitoring.namespaceSelector selects every namespace" in refused.stderr
    assert "networkPolicy" in render_error(helm, "networkPolicy.monitoring.namespaceSelector.labels.a=b")


def test_elastic_capacity_is_an_opt_in_read_of_nodes_and_pods(helm: str) -> None:
    assert not [r for r in of_kind(render(helm), "ClusterRole") if r["metadata"]["name"].endswith("-elastic-capacity")]
    docs = render(helm, "rbac.elasticCapacity=true")
    (role,) = [r for r in of_kind(docs, "ClusterRole") if r["metadata"]["name"] == "r-mpjob-elastic-capacity"]
    assert _grants(role["rules"]) == set(ELASTIC_CALLS.values())
    (binding,) = [b for b in of_kind(docs, "ClusterRoleBinding") if b["roleRef"]["name"] == "r-mpjob-elastic-capacity"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "r-mpjob", "namespace": "mpjob-system"}]


def test_cluster_wide_by_default_namespaced_roles_when_listed(helm: str) -> None:
    docs = render(helm)
    assert not of_kind(docs, "Role") or all(
        "helm.sh/hook" in r["metadata"].get("annotations", {}) for r in of_kind(docs, "Role")
    )
    bindings = of_kind(docs, "ClusterRoleBinding")
    assert {b["roleRef"]["name"] for b in bindings} == {"r-mpjob", "r-mpjob-cluster-reader"}
    for binding in bindings:
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "r-mpjob", "namespace": "mpjob-system"}]

    docs = render(helm, "watchNamespaces={team-a,team-b}")
    assert arg(operator_container(docs), "--namespace") == ["team-a", "team-b"]
    roles = [r for r in of_kind(docs, "Role") if "helm.sh/hook" not in r["metadata"].get("annotations", {})]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    role_bindings = [
        b for b in of_kind(docs, "RoleBinding") if "helm.sh/hook" not in b["metadata"].get("annotations", {})
    ]
    assert sorted(b["metadata"]["namespace"] for b in role_bindings) == ["team-a", "team-b"]
    # Only read-only cluster-scoped access remains: CRDs (kopf's scan), namespaces (kopf's listing)
    # and Kueue's ClusterQueues (an elastic job's quota).
    (reader,) = [r for r in of_kind(docs, "ClusterRole") if not _aggregated(r)]
    assert _grants(reader["rules"]) == {
        ("apiextensions.k8s.io", "customresourcedefinitions", v) for v in ("get", "list", "watch")
    } | {("", "namespaces", v) for v in ("list", "watch")} | {("kueue.x-k8s.io", "clusterqueues", "get")}


# ------------------------------------------------------------------ helm test


def _smoke_module() -> Any:
    spec = importlib.util.spec_from_file_location("mpjob_chart_smoke", CHART / "files/smoke.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_helm_test_job_is_a_valid_tiny_cpu_job() -> None:
    job = MixedPrecisionJob.model_validate(_smoke_module().job_body("helm-test-abc123"))
    assert job.spec.resources.gpus_per_worker == 0
    assert job.spec.training.steps <= 50 and job.spec.task.builtin == "mlp"


def test_helm_test_pod_may_only_create_get_delete_jobs_in_a_watched_namespace(helm: str) -> None:
    docs = render(helm)
    hooks = [d for d in docs if d["metadata"].get("annotations", {}).get("helm.sh/hook") == "test"]
    (pod,) = of_kind(hooks, "Pod")
    (role,) = of_kind(hooks, "Role")
    (binding,) = of_kind(hooks, "RoleBinding")
    (cm,) = of_kind(hooks, "ConfigMap")
    assert _grants(role["rules"]) == {("mpjob.dev", "mixedprecisionjobs", v) for v in ("create", "get", "delete")}
    # Nothing of the test outlives a passing run (helm uninstall never deletes hooks).
    for hook in hooks:
        assert "hook-succeeded" in hook["metadata"]["annotations"]["helm.sh/hook-delete-policy"]
    assert binding["subjects"][0]["name"] == pod["spec"]["serviceAccountName"] != "r-mpjob"
    assert pod["spec"]["containers"][0]["command"] == ["python", "/etc/mpjob-test/smoke.py"]
    assert cm["data"]["smoke.py"] == (CHART / "files/smoke.py").read_text()
    assert pod["spec"]["containers"][0]["image"] == "mpjob-operator:0.1.0"
    # The operator does not watch the release namespace: the test job goes where it does.
    hooks = [
        d for d in render(helm, "watchNamespaces={team-a}") if "helm.sh/hook" in d["metadata"].get("annotations", {})
    ]
    (role,) = of_kind(hooks, "Role")
    (pod,) = of_kind(hooks, "Pod")
    env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
    assert role["metadata"]["namespace"] == env["MPJOB_TEST_NAMESPACE"] == "team-a"


def render_notes(helm: str, workdir: Path, *sets: str) -> str:
    """NOTES.txt as `helm install` prints it (`helm template` leaves it out): rendered through a
    copy of the chart that also puts it into a ConfigMap."""
    chart = workdir / "mpjob"
    if not chart.exists():
        shutil.copytree(CHART, chart)
        notes = (CHART / "templates/NOTES.txt").read_text()
        (chart / "templates/_notes.tpl").write_text('{{- define "notes" -}}\n' + notes + "\n{{- end -}}\n")
        configmap = "kind: ConfigMap\napiVersion: v1\nmetadata: {name: notes}\n"
        (chart / "templates/zz-notes.yaml").write_text(configmap + 'data: {notes: {{ include "notes" . | quote }}}\n')
    args = [helm, "template", "r", str(chart), "-n", "mpjob-system", "--show-only", "templates/zz-notes.yaml"]
    out = subprocess.run(args + [x for s in sets for x in ("--set", s)], capture_output=True, text=True, check=True)
    return str(yaml.safe_load(out.stdout)["data"]["notes"])


def test_helm_test_is_given_the_time_the_test_job_may_take(helm: str, tmp_path: Path) -> None:
    """`helm test` waits 5 minutes unless told otherwise; the test job may take
    tests.timeoutSeconds once its pod runs (and pulling the images comes first)."""

    def helm_test(*sets: str) -> list[str]:
        notes = render_notes(helm, tmp_path, *sets)
        return [line.strip() for line in notes.splitlines() if line.strip().startswith("helm test")]

    (command,) = helm_test()
    timeout = re.fullmatch(r"helm test -n mpjob-system r --timeout (\d+)s", command)
    default = yaml.safe_load((CHART / "values.yaml").read_text())["tests"]["timeoutSeconds"]
    assert timeout and int(timeout.group(1)) > default
    (command,) = helm_test("tests.timeoutSeconds=1800")
    assert int(command.rsplit(" ", 1)[1].rstrip("s")) > 1800
    assert helm_test("tests.enabled=false") == [], "no test to run"
    pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    lines = [line for page in pages for line in page.read_text().splitlines()]
    shown = [line for line in lines if re.search(r"^\s*\$? ?helm test ", line)]
    assert shown and all("--timeout" in line for line in shown), shown


def test_endpoints_listen_everywhere_or_on_the_pod_ip(helm: str) -> None:
    def container(*sets: str) -> dict[str, Any]:
        (deployment,) = of_kind(render(helm, *sets), "Deployment")
        (ctr,) = deployment["spec"]["template"]["spec"]["containers"]
        return ctr

    default = container()
    assert "--bind-address=0.0.0.0" in default["args"]  # port-forward and probes both reach it
    assert "MPJOB_BIND_ADDRESS" not in {e["name"] for e in default["env"]}
    pod_ip = container("operator.bindAddress=podIP")
    assert not [a for a in pod_ip["args"] if a.startswith("--bind-address")]
    (env,) = [e for e in pod_ip["env"] if e["name"] == "MPJOB_BIND_ADDRESS"]
    assert env["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ("operator.maxTicksPerSecond=0", "maxTicksPerSecond"),
        ("operator.bindAddress=", "bindAddress"),
        ("operator.bindAddress=my-host", "bindAddress"),  # an IP (or podIP): not a name
        ("operator.healthPort=8080", "operator.metricsPort and operator.healthPort must differ"),
        # Unknown keys of a selector would be dropped by the API server: the policy would bind everywhere.
        ("admissionPolicy.namespaceSelector.labels.team=a", "admissionPolicy/namespaceSelector"),
        # The API server refuses a liveness probe that must succeed more than once (successThreshold 1).
        ("livenessProbe.successThreshold=2", "livenessProbe/successThreshold"),
        # The Deployment's selector labels: another value there selects no pod, and the API server refuses it.
        ("podLabels.app\\.kubernetes\\.io/component=x", "podLabels"),
        ("podLabels.app\\.kubernetes\\.io/instance=x", "podLabels"),
    ],
)
def test_bad_values_are_refused_naming_the_field(helm: str, value: str, field: str) -> None:
    assert field in render_error(helm, value)


def test_the_profile_key_reaches_the_operator_from_the_charts_secret(helm: str) -> None:
    docs = render(helm)
    (secret,) = [d for d in of_kind(docs, "Secret") if d["metadata"]["name"] == "r-mpjob-profile-key"]
    assert len(base64.b64decode(secret["data"]["key"])) == 48
    (deployment,) = of_kind(docs, "Deployment")
    env = {e["name"]: e for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    ref = env["MPJOB_PROFILE_KEY"]["valueFrom"]["secretKeyRef"]
    assert (ref["name"], ref["key"]) == ("r-mpjob-profile-key", "key") and "value" not in env["MPJOB_PROFILE_KEY"]


# ------------------------------------------------------------------ object names

# The longest release name Helm accepts; the chart's full name adds "-mpjob" unless it is there.
LONGEST_RELEASES = ["r" * 53, "mpjob-" + "r" * 47]
# Kinds whose names are DNS labels (RFC 1035, 63 characters); every other kind the chart
# renders takes a DNS subdomain (253) or, for RBAC objects, a path segment (held to 253 too).
DNS_LABEL_KINDS = {"Service"}


def test_helm_refuses_release_names_over_53_characters(helm: str) -> None:
    result = subprocess.run([helm, "template", "r" * 54, str(CHART)], capture_output=True, text=True)
    assert result.returncode != 0 and "53" in result.stderr


@pytest.mark.parametrize("release", LONGEST_RELEASES)
@pytest.mark.parametrize("watch", [[], ["watchNamespaces={a,b}"]])
def test_every_object_name_fits_its_kind_with_the_longest_release_name(
    helm: str, release: str, watch: list[str]
) -> None:
    sets = [
        *watch,
        "peering.enabled=true",
        "replicaCount=2",
        "rbac.elasticCapacity=true",
        "admissionPolicy.enabled=true",
        "monitoring.prometheusRule.enabled=true",
        "monitoring.dashboards.enabled=true",
        "monitoring.serviceMonitor.enabled=true",
        "monitoring.podMonitor.enabled=true",
    ]
    args = [helm, "template", release, str(CHART), "--namespace", "mpjob-system"]
    args += [x for s in sets for x in ("--set", s)]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    docs = [d for d in yaml.safe_load_all(out) if d]
    assert {"Service", "ClusterRole", "Pod", "ValidatingAdmissionPolicy", "ServiceMonitor"} <= {d["kind"] for d in docs}
    seen: set[tuple[str, str, str]] = set()
    for doc in docs:
        kind, meta = doc["kind"], doc["metadata"]
        name, limit = meta["name"], 63 if doc["kind"] in DNS_LABEL_KINDS else 253
        assert len(name) <= limit, f"{kind} {name}: {len(name)} characters, over {limit}"
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", name), f"{kind} {name}"
        key = (kind, meta.get("namespace", ""), name)
        assert key not in seen, f"two {kind}s named {name}"
        seen.add(key)
        for label, value in meta.get("labels", {}).items():
            assert len(str(value)) <= 63, f"{kind} {name}: label {label}={value} over 63 characters"
    (service,) = of_kind(docs, "Service")
    assert service["metadata"]["name"].endswith("-metrics")
    (monitor,) = of_kind(docs, "ServiceMonitor")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    # Deterministic: the same release renders the same names.
    again = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    assert [d["metadata"]["name"] for d in yaml.safe_load_all(again) if d] == [d["metadata"]["name"] for d in docs]


# ------------------------------------------------------------------ admission policy API

VAP = "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"


def _template(helm: str, *extra: str) -> subprocess.CompletedProcess[str]:
    args = [helm, "template", "r", str(CHART), "--set", "admissionPolicy.enabled=true", *extra]
    return subprocess.run(args, capture_output=True, text=True)


def test_admission_policy_on_a_cluster_without_the_api_fails_naming_the_value_and_version(helm: str) -> None:
    result = _template(helm, "--kube-version", "1.29.0")
    assert result.returncode != 0
    assert "admissionPolicy.enabled" in result.stderr and "1.30" in result.stderr, result.stderr
    # A cluster's discovery lists kinds: one that lacks the policy's fails whatever its version.
    discovered = _template(helm, "--kube-version", "1.31.0", "--api-versions", "apps/v1/Deployment")
    assert discovered.returncode != 0 and "admissionPolicy.enabled" in discovered.stderr
    # Off, the chart still installs on 1.29 (its kubeVersion allows it).
    off = subprocess.run(
        [helm, "template", "r", str(CHART), "--kube-version", "1.29.0"], capture_output=True, text=True
    )
    assert off.returncode == 0, off.stderr


def test_admission_policy_renders_where_the_api_is_served(helm: str) -> None:
    # The API listed (as a cluster's discovery lists it), whatever the version says.
    listed = _template(helm, "--kube-version", "1.29.0", "--api-versions", VAP)
    assert listed.returncode == 0, listed.stderr
    assert "kind: ValidatingAdmissionPolicy" in listed.stdout
    # `helm template`'s defaults list API groups, not kinds: a Kubernetes version that serves it.
    for extra in ([], ["--kube-version", "1.30.0"]):
        result = _template(helm, *extra)
        assert result.returncode == 0, result.stderr
        assert "kind: ValidatingAdmissionPolicyBinding" in result.stdout


# ------------------------------------------------------------------ values.yaml


def _value_comments() -> dict[str, str]:
    """Each key of values.yaml (dotted) and the comment lines right above it or on its line."""
    comments: dict[str, str] = {}
    path: list[tuple[int, str]] = []
    pending: list[str] = []
    for line in (CHART / "values.yaml").read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            pending.append(stripped.lstrip("# "))
            continue
        match = re.match(r"^( *)([A-Za-z][\w.]*):(.*)$", line)
        if not match:
            pending = []
            continue
        indent, key, rest = len(match[1]), match[2], match[3]
        path = [(i, k) for i, k in path if i < indent] + [(indent, key)]
        inline = rest.split(" #", 1)[1].strip() if " #" in rest else ""
        comments[".".join(k for _, k in path)] = " ".join([*pending, inline]).strip()
        pending = []
    return comments


def test_values_say_what_they_do() -> None:
    comments = _value_comments()
    for key in [
        "imagePullSecrets",
        "serviceAccount.create",
        "serviceAccount.name",
        "serviceAccount.annotations",
        "rbac.create",
        "rbac.userRoles",
        "metrics.service.enabled",
        "metrics.service.type",
        "metrics.service.port",
        "metrics.service.annotations",
        "livenessProbe",
        "readinessProbe",
        "operator.extraArgs",
        "operator.extraEnv",
    ]:
        assert comments.get(key), f"values.yaml: {key} has no comment"
    # rbac.create is the operator's own RBAC only: the user roles have their own switch.
    assert "rbac.userRoles" in comments["rbac.create"]
    assert "rbac.create" in comments["rbac.userRoles"]
