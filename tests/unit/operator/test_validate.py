"""`mpjob validate` and the CRD: same rules, field-named messages, no drift."""

from __future__ import annotations

import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from mpjob.crd import crd_yaml
from mpjob.localrun.cli import load_job
from mpjob.validation import MAX_DEPTH, MAX_MANIFEST_BYTES, InvalidManifest, check_document, check_text
from mpjob_contract.api import MAX_TASK_ARG_DEPTH, MAX_TASK_ARGS
from tests.unit.operator.cases import CASES, DEEPEST_TASK_ARGS, FULL_TEMPLATE, GOOD, bad, nested, nested_json, with_args
from tests.unit.operator.test_rules import crd_schema

pytestmark = pytest.mark.unit
REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(("manifest", "needle"), [(c[1], c[2]) for c in CASES], ids=[c[0] for c in CASES])
def test_validate_names_the_field(manifest: dict, needle: str) -> None:
    jobs, problems = check_text(yaml.safe_dump(manifest), "job.yaml")
    assert not jobs and problems
    assert any(needle in str(p) for p in problems), [str(p) for p in problems]


def test_every_error_is_reported_at_once() -> None:
    doc = dict(GOOD, spec={"task": {"builtin": "gpt"}, "workers": 0, "precision": {"mode": "fp4"}})
    _, problems = check_text(yaml.safe_dump(doc))
    fields = {p.field for p in problems}
    assert {"spec.workers", "spec.precision.mode"} <= fields


def test_yaml_syntax_error_names_the_line() -> None:
    _, problems = check_text("apiVersion: mpjob.dev/v1alpha1\nkind: MixedPrecisionJob\nspec: [\n  oops: {\n")
    assert len(problems) == 1 and "line " in str(problems[0])


def test_cli_exit_codes_and_multi_document_files(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(GOOD) + "---\n" + yaml.safe_dump(dict(GOOD, metadata={"name": "two"})))
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(CASES[0][1]))
    ok = subprocess.run([sys.executable, "-m", "mpjob.cli", "validate", str(good)], capture_output=True, text=True)
    assert ok.returncode == 0 and "2 MixedPrecisionJobs" in ok.stdout
    no = subprocess.run([sys.executable, "-m", "mpjob.cli", "validate", str(bad)], capture_output=True, text=True)
    assert no.returncode == 1 and "spec.precision.turbo" in no.stdout


CLAIM = {
    "apiVersion": "v1",
    "kind": "PersistentVolumeClaim",
    "metadata": {"name": "checkpoints"},
    "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
}


def test_validate_skips_documents_of_other_kinds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from mpjob.cli import main

    mixed, claims, job = tmp_path / "mixed.yaml", tmp_path / "claims.yaml", tmp_path / "job.yaml"
    mixed.write_text(yaml.safe_dump(CLAIM) + "---\n" + yaml.safe_dump(GOOD))
    claims.write_text(yaml.safe_dump(CLAIM))
    job.write_text(yaml.safe_dump(GOOD))
    assert main(["validate", str(mixed)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"{mixed}: skipped: PersistentVolumeClaim checkpoints (not a MixedPrecisionJob)",
        f"{mixed}: ok (1 MixedPrecisionJob)",
    ]
    assert main(["validate", str(claims), str(job)]) == 0  # as `kubectl apply -f claims.yaml -f job.yaml`
    assert f"{claims}: no MixedPrecisionJob, only other kinds" in capsys.readouterr().out
    assert main(["validate", str(claims)]) == 1  # nothing to validate is not a pass
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"error: no MixedPrecisionJob in {claims}; give the jobs' manifests too"
    )
    mixed.write_text(yaml.safe_dump(CLAIM) + "---\n" + yaml.safe_dump(bad("spec.workers", 0)))
    assert main(["validate", str(mixed)]) == 1  # a skipped claim does not hide a bad job
    assert "(document 2): spec.workers" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("api_version", "kind"),
    [("v1", "MixedPrecisionJobs"), ("mpjob.dev/v1alpha1", "MixedPrecisionJob2"), ("v1", "mixedprecisionjob")],
    ids=["another-kind-name", "mpjob-group", "another-case"],
)
def test_a_document_that_may_be_meant_as_a_job_is_checked_not_skipped(api_version: str, kind: str) -> None:
    skipped: list = []
    doc = dict(GOOD, apiVersion=api_version, kind=kind)
    jobs, problems = check_text(yaml.safe_dump(doc), "job.yaml", skipped)
    if kind == "MixedPrecisionJobs":  # v1 and another name: plainly another kind
        assert skipped and not problems and not jobs
    else:
        assert not skipped and any(p.field in ("kind", "apiVersion") for p in problems), problems


def test_run_takes_only_a_mixed_precision_job(tmp_path: Path) -> None:
    mixed, claims = tmp_path / "mixed.yaml", tmp_path / "claims.yaml"
    mixed.write_text(yaml.safe_dump(CLAIM) + "---\n" + yaml.safe_dump(GOOD))
    claims.write_text(yaml.safe_dump(CLAIM))
    for path in (mixed, claims):
        with pytest.raises(InvalidManifest, match="kind: a PersistentVolumeClaim checkpoints, not a MixedPrecisionJob"):
            load_job(path)  # what `mpjob run` reads a manifest with


def test_run_names_the_jobs_of_a_file_that_holds_two(tmp_path: Path) -> None:
    two = tmp_path / "two.yaml"
    second = {**GOOD, "metadata": {"name": "second"}}
    two.write_text(yaml.safe_dump(GOOD) + "---\n" + yaml.safe_dump(second))
    with pytest.raises(InvalidManifest, match=rf"found 2 \({GOOD['metadata']['name']}, second\): mpjob run takes one"):
        load_job(two)


def test_every_example_validates() -> None:
    for example in sorted((REPO / "examples").glob("*.yaml")):
        jobs, problems = check_text(example.read_text(), str(example))
        assert not problems and jobs, (example, [str(p) for p in problems])


@pytest.mark.parametrize(
    "path", ["crds/mixedprecisionjobs.mpjob.dev.yaml", "helm/mpjob/crds/mixedprecisionjobs.mpjob.dev.yaml"]
)
def test_committed_crd_matches_the_models(path: str) -> None:
    assert (REPO / path).read_text() == crd_yaml(), f"{path} drifted: run `mpjob crd --write`"


def test_crd_has_printer_columns_short_names_and_status() -> None:
    crd = yaml.safe_load(crd_yaml())
    version = crd["spec"]["versions"][0]
    assert [c["name"] for c in version["additionalPrinterColumns"]] == [
        "Phase",
        "Precision",
        "Step",
        "Loss",
        "Scale",
        "Attempt",
        "Workers",
        "Age",
    ]
    assert crd["spec"]["names"]["shortNames"] == ["mpjob", "mpj"]
    assert version["subresources"] == {"status": {}}
    precision = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["precision"]
    assert precision["properties"]["mode"]["enum"] == ["auto", "fp8", "fp16", "bf16", "fp32"]
    assert "description" in precision["properties"]["fallback"]


def undescribed(node: dict[str, Any], where: str) -> list[str]:
    """Fields below `node` without a description, but for Kubernetes' own schemas (the template's
    pod fields, a checkpoint volume's emptyDir), which the CRD carries as Kubernetes has them."""
    missing, stack = [], [(where, node)]
    while stack:
        where, node = stack.pop()
        for name, field in (node.get("properties") or {}).items():
            path = f"{where}.{name}"
            if path == "spec.template" or name == "emptyDir":
                continue
            missing += [] if "description" in field else [path]
            stack += [(path, field), (f"{path}[]", field.get("items") or {})]
    return missing


def test_every_field_of_the_spec_says_what_it_is() -> None:
    """kubectl explain has something to say about each field."""
    assert undescribed(crd_schema()["properties"]["spec"], "spec") == []


def test_a_template_of_kubernetes_pod_fields_validates() -> None:
    jobs, problems = check_text(yaml.safe_dump(bad("spec.template", FULL_TEMPLATE)))
    assert jobs and not problems, [str(p) for p in problems]
    assert jobs[0].spec.template.volumes[2]["projected"]["sources"][1]["configMap"]["name"] == "cfg"


def test_template_problems_are_all_named_at_once() -> None:
    doc = bad("spec.template", {"env": [{"value": "x"}], "volumeMounts": [{"name": "v"}], "priorityClassName": 3})
    fields = {p.field for p in check_text(yaml.safe_dump(doc))[1]}
    assert fields == {
        "spec.template.env[0].name",
        "spec.template.volumeMounts[0].mountPath",
        "spec.template.priorityClassName",
    }


def test_task_args_cap_is_one_constant_in_the_model_and_the_crd() -> None:
    crd = yaml.safe_load(crd_yaml())
    task = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["task"]
    assert task["properties"]["args"]["maxProperties"] == MAX_TASK_ARGS
    _, problems = check_text(yaml.safe_dump(bad("spec.task.args", {f"a{i}": i for i in range(MAX_TASK_ARGS + 1)})))
    assert [str(p) for p in problems] == [
        f"<input>: spec.task.args: at most {MAX_TASK_ARGS} entries allowed, got {MAX_TASK_ARGS + 1}"
    ]


def test_task_args_as_deep_as_allowed_validate_and_keep_their_values() -> None:
    jobs, problems = check_text(yaml.safe_dump(with_args(DEEPEST_TASK_ARGS)))
    assert jobs and not problems, [str(p) for p in problems]
    assert jobs[0].spec.task.args == DEEPEST_TASK_ARGS


def test_the_crd_bounds_task_args_values_as_deep_as_the_model() -> None:
    crd = yaml.safe_load(crd_yaml())
    task = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["task"]
    node, levels = task["properties"]["args"]["additionalProperties"], 0
    while "items" in node:
        assert node["items"] == node["additionalProperties"]  # lists and maps alike
        node, levels = node["items"], levels + 1
    assert levels == MAX_TASK_ARG_DEPTH and (node["maxItems"], node["maxProperties"]) == (0, 0)


def test_a_1500_level_document_is_refused_quickly_naming_the_field(tmp_path: Path) -> None:
    deep = bad("spec.task.args", nested(1500))
    path = tmp_path / "deep.json"  # JSON, as `kubectl apply -f` would send it
    path.write_text(nested_json(bad("spec.task.args", "HERE"), 1500))
    # "Quickly" in CPU seconds, the command's and then this thread's: what a starved machine adds
    # to the wall clock is not the check's work.
    started = children_cpu_seconds()
    validate = [sys.executable, "-m", "mpjob.cli", "validate", str(path)]
    out = subprocess.run(validate, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "spec.task.args.deep.deep.deep.deep" in out.stdout, out
    assert f"nested deeper than {MAX_DEPTH} levels" in out.stdout
    assert children_cpu_seconds() - started < 20  # the interpreter's start is most of it
    # Already parsed (the operator's path): the model stops at the bound, whatever lies below.
    started = time.thread_time()
    _, problems = check_document(deep)
    assert [p.field for p in problems] == ["spec.task.args.deep.deep.deep.deep"]
    assert f"nested deeper than {MAX_TASK_ARG_DEPTH} levels" in problems[0].message
    assert time.thread_time() - started < 1


def children_cpu_seconds() -> float:
    """The CPU seconds this process's ended (waited-for) children have used."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


GOOD_TEXT = yaml.safe_dump(GOOD)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (GOOD_TEXT + "x-base: &base {a: 1}\nx-copy: *base\n", "YAML aliases (*base) are not allowed"),
        (GOOD_TEXT + "x: &l0 [a]\n" + "".join(f"l{i}: &l{i} [*l{i - 1}, *l{i - 1}]\n" for i in range(1, 30)), "*l0"),
        (GOOD_TEXT + "x-merge:\n  <<: &m {a: 1}\n  b: *m\n", "YAML aliases (*m)"),
        ("x: " + "[" * 5000 + "]" * 5000, f"nested deeper than {MAX_DEPTH} levels"),
        ("x:\n" + "".join("  " * i + "- \n" for i in range(1, 100)), f"line {MAX_DEPTH + 1}: nested deeper"),
        (GOOD_TEXT + "x: '" + "a" * MAX_MANIFEST_BYTES + "'\n", f"at most {MAX_MANIFEST_BYTES}"),
    ],
    ids=["alias", "billion-laughs", "merge-key", "deep-flow", "deep-block", "too-large"],
)
def test_hostile_yaml_is_refused_with_a_clear_error(text: str, needle: str) -> None:
    jobs, problems = check_text(text, "job.yaml")
    assert not jobs and len(problems) == 1 and needle in str(problems[0]), [str(p) for p in problems]


def test_nesting_up_to_the_limit_is_fine_and_one_more_is_not() -> None:
    # metadata.managedFields is taken as written (the API server's own), so the YAML limit is the
    # only one there; task.args has its own, far lower bound (test_task_args_nest_...).
    deep: dict[str, object] = {"deep": 1}
    for _ in range(MAX_DEPTH - 4):  # the root, metadata and the scalar 1 make MAX_DEPTH levels
        deep = {"deep": deep}
    jobs, problems = check_text(yaml.safe_dump(bad("metadata.managedFields", deep)))
    assert jobs and not problems, [str(p) for p in problems]
    _, problems = check_text(yaml.safe_dump(bad("metadata.managedFields", {"deep": deep})))
    assert len(problems) == 1 and problems[0].message.endswith(f": nested deeper than {MAX_DEPTH} levels")


def test_validate_and_run_read_no_further_than_the_limit(tmp_path: Path) -> None:
    huge = tmp_path / "huge.yaml"
    with huge.open("w") as f:
        f.write(GOOD_TEXT + "x: '")
        f.truncate(MAX_MANIFEST_BYTES * 8)  # sparse: a file far larger than what may be read
    out = subprocess.run([sys.executable, "-m", "mpjob.cli", "validate", str(huge)], capture_output=True, text=True)
    assert out.returncode == 1 and f"larger than {MAX_MANIFEST_BYTES} bytes" in out.stdout, out
    with pytest.raises(InvalidManifest, match="larger than"):
        load_job(huge)  # what `mpjob run` reads a manifest with


def test_run_refuses_aliases_before_anything_is_launched(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(GOOD_TEXT.replace("spec:", "spec: &s") + "x: *s\n")
    with pytest.raises(InvalidManifest, match=r"YAML aliases \(\*s\) are not allowed"):
        load_job(bomb)


def test_an_empty_file_argument_is_named_as_one(capsys: pytest.CaptureFixture[str]) -> None:
    from mpjob.cli import main

    assert main(["run", ""]) == 2  # not ".: cannot read: Is a directory" (Path("") is ".")
    assert capsys.readouterr().out == "error: '': cannot read: No such file or directory\n"
    assert main(["validate", ""]) == 1
    assert capsys.readouterr().out == "'': cannot read: No such file or directory\n"


def test_validate_reads_stdin() -> None:
    args = [sys.executable, "-m", "mpjob.cli", "validate", "-"]
    out = subprocess.run(args, input=GOOD_TEXT, capture_output=True, text=True)
    assert out.returncode == 0 and "-: ok (1 MixedPrecisionJob)" in out.stdout, out


def test_a_python_field_name_is_refused_with_its_api_name() -> None:
    _, problems = check_text(yaml.safe_dump(bad("spec.precision", {"in_place": False, "lossScale": {"init": 8.0}})))
    assert [str(p) for p in problems] == [
        "<input>: spec.precision.in_place: unknown field (not allowed by the MixedPrecisionJob schema; "
        "its names are camelCase: inPlace)"
    ]


def test_metadata_takes_kubernetes_object_meta_fields_and_refuses_others() -> None:
    """A misspelt metadata field is refused, as the API server's strict field validation refuses
    it; what `kubectl get -o yaml` writes into metadata validates."""
    served = {
        **GOOD["metadata"],
        **{"uid": "6f0c", "resourceVersion": "42", "generation": 3, "creationTimestamp": "2026-12-01T12:00:00Z"},
        **{"finalizers": ["x.io/keep"], "managedFields": [{"manager": "kubectl", "operation": "Update"}]},
        **{"labels": {"team": "ml"}, "annotations": {"note": "kept"}, "generateName": "q-"},
    }
    jobs, problems = check_text(yaml.safe_dump({**GOOD, "metadata": served}))
    assert (len(jobs), [str(p) for p in problems]) == (1, [])
    _, problems = check_text(yaml.safe_dump({**GOOD, "metadata": {**GOOD["metadata"], "nmae": "x"}}))
    assert [(p.field, p.message) for p in problems] == [
        ("metadata.nmae", "unknown field (not allowed by the MixedPrecisionJob schema; did you mean name?)")
    ]
