"""The cross-field rules table: every rule in the CRD at its path, nothing in the CRD's CEL that
is not in the table (or in the bound settings' transition rules: test_bound_settings_schema), and
every rule broken by a shared bad-manifest case that `mpjob validate` refuses with the rule's
message (tests/integration/operator/test_admission.py: the API server too)."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from mpjob.crd import CEL_RULES, crd_yaml
from mpjob.validation import check_text
from mpjob_contract import binding, rules
from mpjob_contract.api import MixedPrecisionJobSpec
from tests.unit.operator.cases import CASES, RULE_CASES

pytestmark = pytest.mark.unit
CASE_MANIFESTS = {name: manifest for name, manifest, _ in CASES}


def validations_below(node: Any, path: str) -> dict[str, list[dict[str, str]]]:
    """Every `x-kubernetes-validations` below `node`, by the table's path notation (`name[]`:
    the list's items; map values would show as `name{}`, where the table puts no rule)."""
    if not isinstance(node, dict):
        return {}
    found = {path: node["x-kubernetes-validations"]} if "x-kubernetes-validations" in node else {}
    if isinstance(node.get("items"), dict):
        found.update(validations_below(node["items"], path + "[]"))
    if isinstance(node.get("additionalProperties"), dict):
        found.update(validations_below(node["additionalProperties"], path + "{}"))
    for name, child in node.get("properties", {}).items():
        found.update(validations_below(child, f"{path}.{name}".lstrip(".")))
    return found


def crd_schema() -> dict[str, Any]:
    """The generated CRD's schema of the object (its root)."""
    return yaml.safe_load(crd_yaml())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]  # type: ignore[no-any-return]


def test_every_cel_rule_of_the_crd_comes_from_the_table() -> None:
    from_table = rules.cel_by_path([*rules.RULES, *binding.UNCHANGED.values()])
    assert from_table == CEL_RULES
    assert from_table == validations_below(crd_schema(), "")


@pytest.mark.parametrize("rule", rules.RULES, ids=[r.name for r in rules.RULES])
def test_each_rule_sits_in_the_crd_at_its_path(rule: rules.Rule) -> None:
    node = crd_schema()
    for part in [p for p in rule.path.split(".") if p]:
        node = node["properties"][part.removesuffix("[]")]
        node = node["items"] if part.endswith("[]") else node
    assert rule.x_kubernetes_validation() in node["x-kubernetes-validations"]
    if rule.field_path:  # the API server refuses a fieldPath that names no field below the node
        for name in rule.field_path.removeprefix(".").split("."):
            assert name in node["properties"], rule.field_path
            node = node["properties"][name]


def test_rule_names_are_unique_and_each_has_a_bad_manifest_case() -> None:
    assert len({r.name for r in rules.RULES}) == len(rules.RULES)
    assert set(RULE_CASES) == {r.name for r in rules.RULES}
    assert all(cases and set(cases) <= set(CASE_MANIFESTS) for cases in RULE_CASES.values())


@pytest.mark.parametrize(
    ("rule", "case"),
    [(r, case) for r in rules.RULES for case in RULE_CASES[r.name]],
    ids=[f"{r.name}:{case}" for r in rules.RULES for case in RULE_CASES[r.name]],
)
def test_validate_refuses_each_rules_case_with_the_rules_message(rule: rules.Rule, case: str) -> None:
    _, problems = check_text(yaml.safe_dump(CASE_MANIFESTS[case]))
    assert [p.message for p in problems] == [rule.message], [str(p) for p in problems]
    # A rule's item (`[1]`) names the entry of the list its fieldPath names (CEL's cannot index).
    field = re.sub(r"\[\d+\]$", "", problems[0].field) if rule.item is not None else problems[0].field
    assert field.endswith(rule.field_path.removeprefix(".")), problems[0].field


# What each rule's Python check says of a `self`, written as its CEL reads it (has(): set).
HOLDS: list[tuple[rules.Rule, Any, bool]] = [
    (rules.NAME_FITS_CHILD_NAMES, {"metadata": {"name": "x" * rules.MAX_NAME_LENGTH}}, True),
    (rules.NAME_FITS_CHILD_NAMES, {"metadata": {"name": "x" * (rules.MAX_NAME_LENGTH + 1)}}, False),
    (rules.TASK_EXACTLY_ONE_KIND, {"command": ["python"], "args": {}}, True),
    (rules.TASK_EXACTLY_ONE_KIND, {"args": {}}, False),
    (rules.TASK_EXACTLY_ONE_KIND, {"builtin": "gpt", "module": "a:b", "command": ["python"]}, False),
    (rules.TASK_WORKING_DIR_NEEDS_COMMAND, {"command": ["python"], "workingDir": "/app"}, True),
    (rules.TASK_WORKING_DIR_NEEDS_COMMAND, {"builtin": "gpt"}, True),
    (rules.TASK_WORKING_DIR_NEEDS_COMMAND, {"module": "a:b", "workingDir": "/app"}, False),
    (rules.FALLBACK_DISTINCT, [], True),
    (rules.FALLBACK_DISTINCT, ["bf16", "fp32"], True),
    (rules.FALLBACK_DISTINCT, ["fp32", "bf16", "fp32"], False),
    (rules.FALLBACK_NO_FP8, [], True),
    (rules.FALLBACK_NO_FP8, ["bf16", "fp32"], True),
    (rules.FALLBACK_NO_FP8, ["fp8", "bf16", "fp32"], False),
    (rules.FALLBACK_NO_FP8, ["bf16", "fp8"], False),
    (rules.FALLBACK_SAFER_IN_ORDER, {"mode": "fp16", "fallback": ["bf16", "fp32"]}, True),
    (rules.FALLBACK_SAFER_IN_ORDER, {"mode": "fp32", "fallback": []}, True),
    (rules.FALLBACK_SAFER_IN_ORDER, {"mode": "auto", "fallback": ["fp16", "fp32"]}, True),
    (rules.FALLBACK_SAFER_IN_ORDER, {"fallback": ["fp16", "bf16", "fp32"]}, True),  # mode unset: auto
    (rules.FALLBACK_SAFER_IN_ORDER, {"mode": "fp16", "fallback": ["bf16", "bf16", "fp8"]}, True),  # other rules'
    (rules.FALLBACK_SAFER_IN_ORDER, {"mode": "fp32", "fallback": ["fp16"]}, False),
    (rules.FALLBACK_SAFER_IN_ORDER, {"mode": "bf16", "fallback": ["bf16"]}, False),
    (rules.FALLBACK_SAFER_IN_ORDER, {"mode": "fp16", "fallback": ["fp32", "bf16"]}, False),
    (rules.FALLBACK_SAFER_IN_ORDER, {"mode": "auto", "fallback": ["bf16", "fp16"]}, False),
    (rules.NO_SERVICE_ACCOUNT_TOKEN, {"configMap": {"name": "c"}}, True),
    (rules.NO_SERVICE_ACCOUNT_TOKEN, {"serviceAccountToken": {"path": "t"}}, False),
    (rules.NO_POD_CERTIFICATE, {"clusterTrustBundle": {"path": "b", "signerName": "x.io/s"}}, True),
    (rules.NO_POD_CERTIFICATE, {"podCertificate": {"signerName": "x.io/s", "keyType": "ED25519"}}, False),
    (rules.TEMPLATE_SECCOMP_RUNTIME_DEFAULT, {}, True),
    (rules.TEMPLATE_SECCOMP_RUNTIME_DEFAULT, {"annotations": {"seccomp.security.alpha.kubernetes.io/pod": ""}}, False),
    (
        rules.TEMPLATE_SECCOMP_RUNTIME_DEFAULT,
        {
            "annotations": {
                "seccomp.security.alpha.kubernetes.io/pod": "runtime/default",
                "container.seccomp.security.alpha.kubernetes.io/trainer": "docker/default",
                "container.seccomp.security.alpha.kubernetes.io/other": "unconfined",  # no such container
            }
        },
        True,
    ),
    (
        rules.TEMPLATE_SECCOMP_RUNTIME_DEFAULT,
        {"annotations": {"container.seccomp.security.alpha.kubernetes.io/trainer": "unconfined"}},
        False,
    ),
    *(
        (
            rules.TEMPLATE_APPARMOR_PROFILE_NAME,
            {"annotations": {"container.apparmor.security.beta.kubernetes.io/trainer": profile}},
            True,
        )
        for profile in ("runtime/default", "unconfined", "localhost/k8s-trainer")
    ),
    (
        rules.TEMPLATE_APPARMOR_PROFILE_NAME,
        {"annotations": {"container.apparmor.security.beta.kubernetes.io/trainer": "bogus"}},
        False,
    ),
    (
        rules.TEMPLATE_APPARMOR_PROFILE_NAME,
        {"annotations": {"container.apparmor.security.beta.kubernetes.io/trainer": "docker/default"}},
        False,
    ),
    (rules.TEMPLATE_LABELS_NOT_THE_JOB_CONTROLLERS, {"labels": {"team": "ml", "job": "x"}}, True),
    (rules.TEMPLATE_LABELS_NOT_THE_JOB_CONTROLLERS, {"labels": {"controller-uid": ""}}, False),
    (rules.TEMPLATE_LABELS_NOT_THE_JOB_CONTROLLERS, {"labels": {"batch.kubernetes.io/job-name": "j-a1"}}, False),
    (rules.TOLERATION_SECONDS_NEED_NO_EXECUTE, {"key": "k", "operator": "Exists"}, True),
    (rules.TOLERATION_SECONDS_NEED_NO_EXECUTE, {"effect": "NoExecute", "tolerationSeconds": 0}, True),
    (rules.TOLERATION_SECONDS_NEED_NO_EXECUTE, {"effect": "NoSchedule", "tolerationSeconds": 30}, False),
    (rules.TOLERATION_SECONDS_NEED_NO_EXECUTE, {"tolerationSeconds": 30}, False),
    (rules.TOLERATION_EMPTY_KEY_EXISTS, {"operator": "Exists"}, True),
    (rules.TOLERATION_EMPTY_KEY_EXISTS, {"key": "k"}, True),  # operator unset: Equal
    (rules.TOLERATION_EMPTY_KEY_EXISTS, {"key": "", "operator": "Equal"}, False),
    (rules.TOLERATION_EMPTY_KEY_EXISTS, {}, False),
    (rules.TOLERATION_EXISTS_WITHOUT_VALUE, {"key": "k", "operator": "Exists", "value": ""}, True),
    (rules.TOLERATION_EXISTS_WITHOUT_VALUE, {"key": "k", "value": "v"}, True),
    (rules.TOLERATION_EXISTS_WITHOUT_VALUE, {"key": "k", "operator": "Exists", "value": "v"}, False),
    (rules.TEMPLATE_VOLUME_NOT_CHECKPOINTS, {"name": "data", "emptyDir": {}}, True),
    (rules.TEMPLATE_VOLUME_NOT_CHECKPOINTS, {"name": "dshm", "emptyDir": {}}, True),
    (rules.TEMPLATE_VOLUME_NOT_CHECKPOINTS, {"name": "checkpoints", "emptyDir": {}}, False),
    (rules.MOUNT_NOT_AT_CHECKPOINTS, {"name": "checkpoints", "mountPath": "/c", "readOnly": True}, True),
    (rules.MOUNT_NOT_AT_CHECKPOINTS, {"name": "d", "mountPath": "/var/lib/mpjob/checkpoints/sub"}, True),
    (rules.MOUNT_NOT_AT_CHECKPOINTS, {"name": "d", "mountPath": "/var/lib/mpjob/checkpoints/.."}, True),
    (rules.MOUNT_NOT_AT_CHECKPOINTS, {"name": "d", "mountPath": "/var/lib/mpjob/.checkpoints"}, True),
    (rules.MOUNT_NOT_AT_CHECKPOINTS, {"name": "d", "mountPath": "/var/lib/mpjob/checkpoints"}, False),
    (rules.MOUNT_NOT_AT_CHECKPOINTS, {"name": "d", "mountPath": "/var/lib/mpjob/checkpoints/"}, False),
    (rules.MOUNT_NOT_AT_CHECKPOINTS, {"name": "d", "mountPath": "/var//lib/./mpjob/checkpoints/."}, False),
    (rules.MOUNT_NAMES_A_VOLUME, {}, True),
    (rules.MOUNT_NAMES_A_VOLUME, {"template": {"volumeMounts": [{"name": "checkpoints", "mountPath": "/c"}]}}, True),
    (rules.MOUNT_NAMES_A_VOLUME, {"template": {"volumeMounts": [{"name": "dshm", "mountPath": "/s"}]}}, True),
    (
        rules.MOUNT_NAMES_A_VOLUME,
        {"template": {"volumes": [{"name": "d"}], "volumeMounts": [{"name": "d", "mountPath": "/d"}]}},
        True,
    ),
    (rules.MOUNT_NAMES_A_VOLUME, {"template": {"volumeMounts": [{"name": "d", "mountPath": "/d"}]}}, False),
    (
        rules.MOUNT_NAMES_A_VOLUME,
        {"resources": {"gpusPerWorker": 0}, "template": {"volumeMounts": [{"name": "dshm", "mountPath": "/s"}]}},
        False,
    ),
    (
        rules.MOUNT_NAMES_A_VOLUME,
        {
            "template": {
                "volumeMounts": [{"name": "checkpoints", "mountPath": "/dev/shm"}, {"name": "dshm", "mountPath": "/s"}]
            }
        },
        False,
    ),
    (rules.ONE_CHECKPOINT_SOURCE, {"emptyDir": {}}, True),
    (rules.ONE_CHECKPOINT_SOURCE, {"persistentVolumeClaim": {"claimName": "c"}}, True),
    (rules.ONE_CHECKPOINT_SOURCE, {}, False),
    (rules.WRITABLE_CHECKPOINT_CLAIM, {"claimName": "c"}, True),
    (rules.WRITABLE_CHECKPOINT_CLAIM, {"claimName": "c", "readOnly": False}, True),
    (rules.WRITABLE_CHECKPOINT_CLAIM, {"claimName": "c", "readOnly": True}, False),
    (rules.BUCKET_NOT_AN_IP_ADDRESS, "training-checkpoints", True),
    (rules.BUCKET_NOT_AN_IP_ADDRESS, "192.168.1.1.backups", True),
    (rules.BUCKET_NOT_AN_IP_ADDRESS, "10.0.0", True),
    (rules.BUCKET_NOT_AN_IP_ADDRESS, "192.168.1.1", False),
    (rules.BUCKET_NOT_AN_IP_ADDRESS, "999.0.0.01", False),
    (rules.ONE_STORAGE_KIND, {"s3": {"bucket": "b"}}, True),
    (rules.ONE_STORAGE_KIND, {"volume": {"emptyDir": {}}}, True),
    (rules.ONE_STORAGE_KIND, {}, False),
    (rules.ONE_STORAGE_KIND, {"volume": {}, "s3": {}}, False),
    (rules.VOLUME_OR_STORAGE, {"everySteps": 5, "storage": {"s3": {}}}, True),
    (rules.VOLUME_OR_STORAGE, {"volume": {"emptyDir": {}}}, True),
    (rules.VOLUME_OR_STORAGE, {"volume": {}, "storage": {}}, False),
    (rules.FAULT_RULE_ALLOWED, {"fault": "NumericFault", "action": "Fail"}, True),
    (rules.FAULT_RULE_ALLOWED, {"fault": "NonFiniteInFp32", "action": "Skip"}, True),
    (rules.FAULT_RULE_ALLOWED, {"fault": "NumericFault", "action": "Skip"}, False),
    (rules.FAULT_RULE_ALLOWED, {"fault": "Preempted", "action": "FallBack"}, False),
    (rules.FAULT_RULE_ALLOWED, {"fault": "Stagnation", "action": "Retry"}, True),
    (rules.FAULT_RULE_ALLOWED, {"fault": "LossScaleCollapsed", "action": "RollBack"}, False),
    (rules.FAULT_RULE_ALLOWED, {"on": "NumericFault", "action": "Fail"}, True),
    (rules.FAULT_RULE_ALLOWED, {"on": "NumericFault", "action": "Skip"}, False),
    (rules.FAULT_RULE_NAMES_ONE_FAULT, {"fault": "NumericFault", "action": "Fail"}, True),
    (rules.FAULT_RULE_NAMES_ONE_FAULT, {"on": "NumericFault", "action": "Fail"}, True),
    (rules.FAULT_RULE_NAMES_ONE_FAULT, {"fault": "NumericFault", "on": "NumericFault", "action": "Fail"}, False),
    (rules.FAULT_RULE_NAMES_ONE_FAULT, {"action": "Fail"}, False),
    (rules.ELASTIC_MIN_WORKERS_FIT, {"workers": 3}, True),
    (rules.ELASTIC_MIN_WORKERS_FIT, {"workers": 3, "elastic": {"minWorkers": 3}}, True),
    (rules.ELASTIC_MIN_WORKERS_FIT, {"elastic": {"minWorkers": 1}}, True),
    (rules.ELASTIC_MIN_WORKERS_FIT, {"workers": 3, "elastic": {"minWorkers": 4}}, False),
    (rules.ELASTIC_MIN_WORKERS_FIT, {"elastic": {"minWorkers": 2}}, False),
    (rules.GATE_NEEDS_FP32_GATHERING, {"parallelism": {"strategy": "fsdp"}, "validation": {"everySteps": 0}}, True),
    (rules.GATE_NEEDS_FP32_GATHERING, {"parallelism": {"strategy": "fsdp"}, "validation": {"everySteps": 5}}, False),
    (
        rules.GATE_NEEDS_FP32_GATHERING,
        {"parallelism": {"strategy": "fsdp"}, "validation": {"everySteps": 5}, "precision": {"mode": "bf16"}},
        False,
    ),
]


@pytest.mark.parametrize(("rule", "value", "holds"), HOLDS, ids=[f"{r.name}-{i}" for i, (r, _, _) in enumerate(HOLDS)])
def test_each_rules_python_check(rule: rules.Rule, value: Any, holds: bool) -> None:
    assert rule.holds(value) is holds
    assert (rule.violation(value, at="x") is None) is holds


def test_every_rule_has_a_holding_and_a_breaking_example() -> None:
    assert {(r.name, h) for r, _, h in HOLDS} == {(r.name, h) for r in rules.RULES for h in (True, False)}


def test_a_rule_with_a_field_path_names_that_field() -> None:
    found = rules.NO_SERVICE_ACCOUNT_TOKEN.violation({"serviceAccountToken": {}}, at="volumes[0].projected.sources[1]")
    assert found == ("volumes[0].projected.sources[1].serviceAccountToken", rules.NO_TOKEN)
    with pytest.raises(ValueError, match="readOnly must be false") as caught:
        rules.WRITABLE_CHECKPOINT_CLAIM.check({"readOnly": True})
    assert caught.value.violations == [("readOnly", rules.READ_ONLY_CLAIM)]  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "spec",
    [
        {
            "parallelism": {"strategy": "fsdp", "fsdp": {"mixedPrecisionParam": "fp32"}},
            "validation": {"everySteps": 10},
        },
        {"parallelism": {"strategy": "fsdp"}, "validation": {"everySteps": 10}, "precision": {"mode": "fp32"}},
        {"parallelism": {"strategy": "fsdp"}, "validation": {"everySteps": 0}},
        {"parallelism": {"strategy": "ddp"}, "validation": {"everySteps": 10}},
    ],
    ids=["gathered-in-fp32", "fp32-only", "no-gate", "ddp"],
)
def test_a_quality_gate_that_can_compute_in_fp32_is_accepted(spec: dict[str, Any]) -> None:
    """The gate's rule refuses only a sharded model gathered in a low precision for good; the
    spec's own check (mpjob validate, the operator) says the same."""
    assert rules.GATE_NEEDS_FP32_GATHERING.holds(spec)
    assert MixedPrecisionJobSpec.model_validate({"task": {"builtin": "gpt"}, **spec}).validation.every_steps in (0, 10)
