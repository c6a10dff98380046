"""`mpjob validate` and the CRD: same rules, field-named messages, no drift."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mpjob.crd import crd_yaml
from mpjob.validation import check_text
from tests.unit.operator.cases import CASES, GOOD

pytestmark = pytest.mark.unit
REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(("manifest", "needle"), [(c[1], c[2]) for c in CASES], ids=[c[0] for c in CASES])
def test_validate_names_the_field(manifest: dict, needle: str) -> None:
    jobs, problems = check_text(yaml.safe_dump(manifest), "job.yaml")
    assert not jobs and problems
    assert any(needle in str(p) for p in problems), [str(p) for p in problems]


def test_every_error_is_reported_at_once() -> None:
    doc = dict(GOOD, spec={"task": {"builtin": "gpt"}, "workers": 0, "precision": {"mode": "fp8"}})
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
        "Age",
    ]
    assert crd["spec"]["names"]["shortNames"] == ["mpjob", "mpj"]
    assert version["subresources"] == {"status": {}}
    precision = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["precision"]
    assert precision["properties"]["mode"]["enum"] == ["auto", "fp16", "bf16", "fp32"]
    assert "description" in precision["properties"]["fallback"]
