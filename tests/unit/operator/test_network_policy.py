"""The attempt's NetworkPolicy manifest, and the operator setting that turns it on."""

from __future__ import annotations

import json

import pytest

from mpjob.builders.attempt import attempt_job, attempt_service
from mpjob.builders.network_policy import MetricsReaders, attempt_network_policy
from mpjob.controller.config import from_environment
from mpjob.controller.main import parser
from mpjob.planning.planner import StartAttempt
from mpjob_contract.api import MixedPrecisionJobSpec

pytestmark = pytest.mark.unit

OPERATOR = {
    "app.kubernetes.io/name": "mpjob",
    "app.kubernetes.io/instance": "r",
    "app.kubernetes.io/component": "operator",
}
MONITORING = {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}
PROMETHEUS = {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}


def test_only_the_attempts_own_pods_and_the_metrics_readers_get_in() -> None:
    readers = MetricsReaders("mpjob-system", OPERATOR, MONITORING, PROMETHEUS)
    policy = attempt_network_policy("gpt", "ml", index=2, precision="bf16", readers=readers)
    attempt = {"matchLabels": {"mpjob.dev/job": "gpt", "mpjob.dev/attempt": "2"}}
    assert policy == {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": "gpt-a2",
            "namespace": "ml",
            "labels": {
                "app.kubernetes.io/name": "mpjob-trainer",
                "app.kubernetes.io/managed-by": "mpjob",
                "mpjob.dev/job": "gpt",
                "mpjob.dev/attempt": "2",
                "mpjob.dev/precision": "bf16",
            },
        },
        "spec": {
            "podSelector": attempt,
            "policyTypes": ["Ingress"],
            "ingress": [
                # Rendezvous at rank 0, then NCCL/Gloo on ports they pick: every port, same attempt only.
                {"from": [{"podSelector": attempt}]},
                {
                    "from": [
                        {
                            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "mpjob-system"}},
                            "podSelector": {"matchLabels": OPERATOR},
                        },
                        {"namespaceSelector": MONITORING, "podSelector": PROMETHEUS},
                    ],
                    "ports": [{"protocol": "TCP", "port": 9400}],
                },
            ],
        },
    }


def test_the_policy_selects_exactly_the_pods_its_service_does_and_names_their_ports() -> None:
    spec = MixedPrecisionJobSpec.model_validate({"task": {"builtin": "gpt"}, "workers": 4})
    start = StartAttempt(index=1, precision="fp16", resume_from=None, start_step=0)
    job = attempt_job(job="gpt", namespace="ml", uid="u", spec=spec, start=start, image="t:1")
    service = attempt_service("gpt", "ml", 1, "fp16")
    policy = attempt_network_policy("gpt", "ml", index=1, precision="fp16", readers=MetricsReaders("ops", OPERATOR))
    selected = policy["spec"]["podSelector"]["matchLabels"]
    assert selected == service["spec"]["selector"]
    pod_labels = job["spec"]["template"]["metadata"]["labels"]
    assert selected.items() <= pod_labels.items()
    assert policy["spec"]["ingress"][0]["from"] == [{"podSelector": {"matchLabels": selected}}]
    ports = {p["name"]: p["containerPort"] for p in job["spec"]["template"]["spec"]["containers"][0]["ports"]}
    assert policy["spec"]["ingress"][1]["ports"] == [{"protocol": "TCP", "port": ports["metrics"]}]
    # No monitoring namespaces given: only the operator reads the metrics.
    assert len(policy["spec"]["ingress"][1]["from"]) == 1


def test_a_users_template_labels_cannot_widen_the_policy() -> None:
    spec = MixedPrecisionJobSpec.model_validate(
        {"task": {"builtin": "gpt"}, "template": {"labels": {"mpjob.dev/attempt": "9", "mpjob.dev/job": "other"}}}
    )
    job = attempt_job(
        job="gpt",
        namespace="ml",
        uid="u",
        spec=spec,
        start=StartAttempt(index=0, precision="fp16", resume_from=None, start_step=0),
        image="t",
    )
    policy = attempt_network_policy("gpt", "ml", index=0, precision="fp16", readers=MetricsReaders("ops", OPERATOR))
    labels = job["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()


def test_the_operator_makes_policies_only_when_configured() -> None:
    assert from_environment({}).network_policy is None
    setting = {
        "operatorNamespace": "mpjob-system",
        "operatorLabels": OPERATOR,
        "monitoringNamespaces": MONITORING,
        "monitoringPods": PROMETHEUS,
    }
    config = from_environment({"MPJOB_NETWORK_POLICY": json.dumps(setting)})
    assert config.network_policy == MetricsReaders("mpjob-system", OPERATOR, MONITORING, PROMETHEUS)
    only_operator = {"operatorNamespace": "ops", "operatorLabels": OPERATOR}
    assert from_environment({"MPJOB_NETWORK_POLICY": json.dumps(only_operator)}).network_policy == MetricsReaders(
        "ops", OPERATOR
    )


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("{", "Invalid JSON"),
        ('{"operatorLabels": {"a": "b"}}', "operatorNamespace: Field required"),
        ('{"operatorNamespace": "ops", "operatorLabels": {}}', "operatorLabels:"),
        (
            '{"operatorNamespace": "ops", "operatorLabels": {"a": "b"}, "monitoringNamespaces": {}}',
            "monitoringNamespaces:",
        ),
        (
            '{"operatorNamespace": "ops", "operatorLabels": {"a": "b"}, "monitoringNamespaces": {"matchLabels": {}}}',
            "monitoringNamespaces: selects every namespace",
        ),
        (
            '{"operatorNamespace": "ops", "operatorLabels": {"a": "b"}, "monitoringPods": {"app": "x"}}',
            "monitoringPods.app: Extra inputs are not permitted",
        ),
        ('{"operatorNamespace": "ops", "operatorLabels": {"a": "b"}, "egress": true}', "egress:"),
    ],
)
def test_a_bad_network_policy_setting_is_refused_naming_the_field(
    value: str, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        parser({"MPJOB_NETWORK_POLICY": value}).parse_args([])
    err = capsys.readouterr().err
    assert "argument --network-policy:" in err and said in err
