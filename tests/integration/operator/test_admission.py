"""The API server rejects the same manifests as `mpjob validate`, naming the field."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from mpjob.builders.attempt import attempt_job
from mpjob.planning.planner import StartAttempt
from mpjob.validation import check_text
from mpjob_contract import rules
from mpjob_contract.api import MixedPrecisionJobSpec
from mpjob_contract.faults import Fault, FaultAction
from tests.integration.operator.conftest import Jobs, Operator
from tests.unit.operator.cases import CASES, DEEPEST_TASK_ARGS, FULL_TEMPLATE, GOOD, RULE_CASES, bad, nested_json
from tests.unit.test_docs_manifests import shown_jobs

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(("manifest", "needle"), [(c[1], c[2]) for c in CASES], ids=[c[0] for c in CASES])
def test_api_server_rejects_with_the_field_named(api_client, shipped_crd, namespace, manifest, needle) -> None:
    custom = client.CustomObjectsApi(api_client)
    with pytest.raises(client.rest.ApiException) as caught:
        custom.create_namespaced_custom_object(
            "mpjob.dev", "v1alpha1", namespace, "mixedprecisionjobs", manifest, field_validation="Strict"
        )
    assert caught.value.status in (400, 422)
    assert needle in caught.value.body, caught.value.body


RULE_CASE_MANIFESTS = [(r, next(c[1] for c in CASES if c[0] == RULE_CASES[r.name][0])) for r in rules.RULES]


@pytest.mark.parametrize(("rule", "manifest"), RULE_CASE_MANIFESTS, ids=[r.name for r in rules.RULES])
def test_api_server_refuses_each_rule_with_the_tables_message(
    api_client, crd_installed, namespace, rule: rules.Rule, manifest: dict
) -> None:
    """The CEL of each cross-field rule is what refuses its case, saying what `mpjob validate` says."""
    custom = client.CustomObjectsApi(api_client)
    with pytest.raises(client.rest.ApiException) as caught:
        custom.create_namespaced_custom_object("mpjob.dev", "v1alpha1", namespace, "mixedprecisionjobs", manifest)
    said = json.loads(caught.value.body)["message"]
    assert caught.value.status == 422 and rule.message in said, said
    (problem,) = check_text(yaml.safe_dump(manifest))[1]
    if rule.path:  # both name the same field (a rule on the object itself: the server names none);
        # mpjob validate may name the list's item too (rule.item), which CEL's fieldPath cannot
        field = re.sub(r"\[\d+\]$", "", problem.field) if rule.item is not None else problem.field
        assert f"{field}: " in said, (problem.field, said)


#: Template maps the pod API reads beside the operator's own fields: (template, whether both admit it).
POD_API_MAPS = [
    (
        {
            "annotations": {
                "seccomp.security.alpha.kubernetes.io/pod": "runtime/default",
                "container.seccomp.security.alpha.kubernetes.io/trainer": "docker/default",
            }
        },
        True,
    ),
    ({"annotations": {"seccomp.security.alpha.kubernetes.io/pod": "unconfined"}}, False),
    ({"annotations": {"container.seccomp.security.alpha.kubernetes.io/trainer": "localhost/p"}}, False),
    *(
        ({"annotations": {"container.apparmor.security.beta.kubernetes.io/trainer": value}}, True)
        for value in ("unconfined", "localhost/k8s-trainer", "")
    ),
    *(
        ({"annotations": {"container.apparmor.security.beta.kubernetes.io/trainer": value}}, False)
        for value in ("bogus", "docker/default")
    ),
    ({"labels": {"team": "ml", "batch.kubernetes.io/job-completion-index": "0"}}, True),
    *(({"labels": {key: "maps-a0"}}, False) for key in ("job-name", "batch.kubernetes.io/job-name")),
    *(({"labels": {key: "u-1"}}, False) for key in ("controller-uid", "batch.kubernetes.io/controller-uid")),
]


@pytest.mark.parametrize(("template", "admitted"), POD_API_MAPS)
def test_the_rules_refuse_what_the_job_api_refuses_in_the_attempts_job(
    api_client, namespace, template: dict, admitted: bool
) -> None:
    """A template the rules admit makes an attempt Job the Job API admits; one they refuse at apply
    would have been refused only when the operator made the attempt's Job."""
    _, problems = check_text(yaml.safe_dump(bad("spec.template", template)))
    assert (problems == []) is admitted, [str(p) for p in problems]
    spec = MixedPrecisionJobSpec.model_validate({"task": {"builtin": "mlp"}, "resources": {"gpusPerWorker": 0}})
    spec.template.labels, spec.template.annotations = template.get("labels", {}), template.get("annotations", {})
    start = StartAttempt(index=1, precision="fp32", resume_from=None, start_step=0)
    job = attempt_job(job="maps", namespace=namespace, uid="u-1", spec=spec, start=start, image="mpjob-trainer:0")
    batch = client.BatchV1Api(api_client)
    if admitted:
        batch.create_namespaced_job(namespace, job, dry_run="All")
        return
    with pytest.raises(client.rest.ApiException) as caught:
        batch.create_namespaced_job(namespace, job, dry_run="All")
    assert caught.value.status == 422, caught.value.body


def test_api_server_accepts_and_defaults_a_good_manifest(api_client, crd_installed, namespace) -> None:
    custom = client.CustomObjectsApi(api_client)
    made = custom.create_namespaced_custom_object("mpjob.dev", "v1alpha1", namespace, "mixedprecisionjobs", GOOD)
    assert made["spec"]["training"]["steps"] == 2000  # structural defaults applied
    assert made["spec"]["precision"]["guard"]["maxConsecutiveOverflows"] == 20


def test_a_full_kubernetes_template_is_stored_as_written(api_client, crd_installed, namespace) -> None:
    """Kubernetes' own schemas admit its pod fields whole: nothing of the template is pruned."""
    custom = client.CustomObjectsApi(api_client)
    manifest = bad("spec.template", FULL_TEMPLATE)
    manifest["metadata"] = {"name": "full-template"}
    made = custom.create_namespaced_custom_object(
        "mpjob.dev", "v1alpha1", namespace, "mixedprecisionjobs", manifest, field_validation="Strict"
    )
    assert made["spec"]["template"] == FULL_TEMPLATE
    jobs, problems = check_text(yaml.safe_dump(manifest))
    assert jobs and not problems, [str(p) for p in problems]


def test_task_args_as_deep_as_allowed_are_stored_as_written(api_client, crd_installed, namespace) -> None:
    custom = client.CustomObjectsApi(api_client)
    manifest = bad("spec.task.args", DEEPEST_TASK_ARGS)
    manifest["metadata"] = {"name": "deepest-args"}
    made = custom.create_namespaced_custom_object(
        "mpjob.dev", "v1alpha1", namespace, "mixedprecisionjobs", manifest, field_validation="Strict"
    )
    assert made["spec"]["task"]["args"] == DEEPEST_TASK_ARGS


@pytest.mark.parametrize("how", [["apply"], ["apply", "--server-side"], ["create"]])
def test_a_1500_level_document_is_refused_at_apply_naming_the_field(
    kubeconfig: str, cluster_bin: Path, shipped_crd: None, namespace: str, tmp_path: Path, how: list[str]
) -> None:
    """The API server itself refuses it: the CRD bounds task.args, so nothing stores a document a
    client's JSON parser cannot read (the operator's watch died on one)."""
    manifest = bad("spec.task.args", {"deep": "HERE"})
    manifest["metadata"] = {"name": "deep"}
    path = tmp_path / "deep.json"
    path.write_text(nested_json(manifest, 1500))
    kubectl = [str(cluster_bin / "kubectl"), "--kubeconfig", kubeconfig, "-n", namespace]
    out = subprocess.run([*kubectl, *how, "-f", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "spec.task.args.deep.deep.deep.deep" in out.stderr, out
    listed = subprocess.run([*kubectl, "get", "mpj", "-o", "name"], capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0 and listed.stdout.strip() == ""


def test_kubectl_applies_every_job_the_docs_show(
    kubeconfig: str, cluster_bin: Path, crd_installed: None, namespace: str, tmp_path: Path
) -> None:
    """kubectl reads YAML as 1.1 does (an unquoted `on` is true): the docs' own manifests and
    spec fragments, written back as kubectl would send them, are all accepted."""
    path = tmp_path / "docs.yaml"
    jobs = [dict(job, metadata={"name": f"docs-{i}"}) for i, (_, job) in enumerate(shown_jobs())]
    path.write_text(yaml.safe_dump_all(jobs))
    kubectl = [str(cluster_bin / "kubectl"), "--kubeconfig", kubeconfig, "-n", namespace]
    out = subprocess.run(
        [*kubectl, "apply", "--dry-run=server", "-f", str(path)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0 and out.stdout.count("created (server dry run)") == len(jobs), out


def test_a_job_stored_with_the_former_name_on_keeps_its_rule(api_client, crd_installed, namespace) -> None:
    """`"on"` (quoted) is still read: the server stores it as written and the models decide by it."""
    custom = client.CustomObjectsApi(api_client)
    manifest = bad("spec.faultPolicy", {"rules": [{"on": "NumericFault", "action": "Fail"}]})
    made = custom.create_namespaced_custom_object("mpjob.dev", "v1alpha1", namespace, "mixedprecisionjobs", manifest)
    assert made["spec"]["faultPolicy"]["rules"] == [{"on": "NumericFault", "action": "Fail"}]
    (job,), problems = check_text(yaml.safe_dump(made))
    assert problems == [] and job.spec.fault_policy.decide(Fault.NUMERIC_FAULT).action is FaultAction.FAIL


ARGS_AS_WRITTEN = """apiVersion: mpjob.dev/v1alpha1
kind: MixedPrecisionJob
metadata: {name: scalars}
spec:
  task:
    module: my_pkg.train:make_task
    args: {lr: 1e-3, eps: 1e-8, warmup: 3e2, decay: 1.5e3, half: .5, big: 1_000, hex: 0x1F, tag: "1e-3",
           answer: y, maybe: n}
  training: {learningRate: 6e-4}
"""


def test_mpjob_reads_a_manifests_numbers_as_kubectl_does(
    kubeconfig: str, cluster_bin: Path, crd_installed: None, namespace: str, tmp_path: Path
) -> None:
    """`mpjob run` and `mpjob validate` read the scalars kubectl sends to the API server: 1e-3 is a
    number to both (YAML 1.1 alone keeps it a string), so a task gets the same args locally (a
    module task's: its args are its own, a builtin's are checked)."""
    path = tmp_path / "scalars.yaml"
    path.write_text(ARGS_AS_WRITTEN)
    kubectl = [str(cluster_bin / "kubectl"), "--kubeconfig", kubeconfig, "-n", namespace]
    out = subprocess.run([*kubectl, "create", "--dry-run=server", "-o", "json", "-f", str(path)],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr
    stored = json.loads(out.stdout)["spec"]
    (job,), problems = check_text(ARGS_AS_WRITTEN)
    assert problems == [] and job.spec.task.args == stored["task"]["args"]
    assert stored["task"]["args"]["lr"] == 0.001 and stored["task"]["args"]["tag"] == "1e-3"
    assert job.spec.training.learning_rate == stored["training"]["learningRate"] == 6e-4


def test_the_operator_fails_a_stored_job_whose_task_args_name_an_argument_false(operator: Operator, jobs: Jobs) -> None:
    """kubectl turns an unquoted `n: 4` into `"false": 4` and the API server stores it (task.args is
    free-form): the operator refuses the spec before any pod, naming the field and the fix."""
    jobs.create("boolean-name", {"task": {"builtin": "mlp", "args": {"false": 4}}, "resources": {"gpusPerWorker": 0}})
    status = jobs.wait_phase("boolean-name", "Failed", 60)
    assert status["message"].startswith("invalid spec: spec.task.args: names an argument false"), status
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "InvalidSpec" and "quote the argument's name" in failed["message"]
    assert jobs.attempt_jobs("boolean-name") == []


#: Integers as a manifest may write them, beside a Kubernetes-typed field's and one of the CRD's own.
WRITTEN_INTEGERS = ["30", "30.0", "9223372036854775807", "9223372036854775808", "-9223372036854775809",
                    "9007199254740994.0", "1e308", "1.5", ".inf"]  # fmt: skip


@pytest.mark.parametrize("written", WRITTEN_INTEGERS)
def test_mpjob_takes_the_integers_kubectl_gets_the_api_server_to_take(
    kubeconfig: str, cluster_bin: Path, crd_installed: None, namespace: str, tmp_path: Path, written: str
) -> None:
    manifest = f"""apiVersion: mpjob.dev/v1alpha1
kind: MixedPrecisionJob
metadata: {{name: integers}}
spec:
  task: {{builtin: mlp}}
  template:
    tolerations: [{{key: k, operator: Exists, effect: NoExecute, tolerationSeconds: {written}}}]
"""
    path = tmp_path / "integers.yaml"
    path.write_text(manifest)
    kubectl = [str(cluster_bin / "kubectl"), "--kubeconfig", kubeconfig, "-n", namespace]
    out = subprocess.run([*kubectl, "create", "--dry-run=server", "-f", str(path)],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    problems = check_text(manifest)[1]
    assert (problems == []) is (out.returncode == 0), (out.stderr, [str(p) for p in problems])
    if problems:
        assert "spec.template.tolerations[0].tolerationSeconds" in str(problems[0])
