"""What the docs show is what the API has: every MixedPrecisionJob, and every `spec:` fragment
(completed with a builtin task), in README.md's and docs/'s YAML blocks validates with no warning, read as
kubectl reads YAML (1.1: an unquoted `on` is true); the column lists, and the header rows of the
`kubectl get mpj` output they show, name the CRD's columns."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from mpjob.crd import PRINTER_COLUMNS
from mpjob.validation import check_document
from mpjob_contract.api import API_VERSION, KIND
from mpjob_contract.spec_warnings import warning_lines

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
BLOCK = re.compile(r"^```ya?ml\n(.*?)^```", re.S | re.M)


def shown_jobs() -> list[tuple[str, dict[str, Any]]]:
    """(page:line, the job) for each manifest or spec fragment a page shows."""
    found = []
    for page in PAGES:
        text = page.read_text()
        for block in BLOCK.finditer(text):
            where = f"{page.relative_to(REPO)}:{text.count(chr(10), 0, block.start()) + 1}"
            for doc in yaml.safe_load_all(block.group(1)):
                if isinstance(doc, dict) and isinstance(doc.get("spec"), dict) and doc.get("kind", KIND) == KIND:
                    job = {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": "docs"}, **doc}
                    job["spec"] = {"task": {"builtin": "gpt"}, **doc["spec"]}
                    found.append((where, job))
    return found


def test_the_docs_show_jobs_and_spec_fragments() -> None:
    places = {where.split(":")[0] for where, _ in SHOWN}
    assert {"README.md", "docs/fault-policy.md", "docs/sdk.md", "docs/elastic.md"} <= places


SHOWN = shown_jobs()


@pytest.mark.parametrize(("where", "job"), SHOWN, ids=[where for where, _ in SHOWN])
def test_each_job_the_docs_show_validates(where: str, job: dict[str, Any]) -> None:
    valid, problems = check_document(job, where)
    assert valid is not None, [str(p) for p in problems]
    assert warning_lines(valid.spec, where) == []  # no setting shown that never applies


def test_every_list_of_kubectl_get_mpj_columns_names_the_crds() -> None:
    columns = " ".join(column["name"].upper() for column in PRINTER_COLUMNS)
    places = [*PAGES, REPO / "helm/mpjob/templates/NOTES.txt"]
    lines = [(page.name, " ".join(line.split())) for page in places for line in page.read_text().splitlines()]
    lists = [(name, line) for name, line in lines if "PHASE PRECISION" in line]  # the header rows shown too
    assert len(lists) >= 8 and all(columns in line for _, line in lists), (columns, lists)
