"""Manifest checking with the same models the CRD is generated from.

`check_text` returns every problem at once, each naming its field path (camelCase, as the
user wrote it) and what is allowed; YAML syntax errors name the line.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from mpjob_contract.api import API_VERSION, KIND, MixedPrecisionJob


@dataclass(frozen=True)
class Problem:
    source: str
    document: int
    field: str
    message: str

    def __str__(self) -> str:
        where = f"{self.source}" + (f" (document {self.document + 1})" if self.document else "")
        return f"{where}: {self.field}: {self.message}" if self.field else f"{where}: {self.message}"


class InvalidManifest(Exception):
    def __init__(self, problems: list[Problem]) -> None:
        super().__init__("\n".join(str(p) for p in problems))
        self.problems = problems


def _path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("function-after", "function-before") or str(part).startswith(("literal[", "str", "int")):
            continue
        else:
            out += ("." if out else "") + str(part)
    return out


def _message(error: Any) -> str:
    msg = str(error["msg"])
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    if error["type"] == "extra_forbidden":
        return "unknown field (not allowed by the MixedPrecisionJob schema)"
    if error["type"] == "missing":
        return "required field is missing"
    ctx = error.get("ctx") or {}
    if "expected" in ctx and error["type"] in ("literal_error", "enum"):
        return f"must be one of {ctx['expected']}, got {error.get('input')!r}"
    return msg


def check_document(doc: Any, source: str = "<input>", index: int = 0) -> tuple[MixedPrecisionJob | None, list[Problem]]:
    if not isinstance(doc, dict):
        return None, [Problem(source, index, "", f"expected a mapping (a Kubernetes object), got {type(doc).__name__}")]
    problems: list[Problem] = []
    if doc.get("apiVersion") != API_VERSION:
        problems.append(Problem(source, index, "apiVersion", f"must be {API_VERSION}, got {doc.get('apiVersion')!r}"))
    if doc.get("kind") != KIND:
        problems.append(Problem(source, index, "kind", f"must be {KIND}, got {doc.get('kind')!r}"))
    if problems:
        return None, problems
    try:
        return MixedPrecisionJob.model_validate(doc), []
    except ValidationError as exc:
        return None, [Problem(source, index, _path(e["loc"]), _message(e)) for e in exc.errors()]


def check_text(text: str, source: str = "<input>") -> tuple[list[MixedPrecisionJob], list[Problem]]:
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        return [], [Problem(source, 0, "", f"YAML syntax error at {line}{problem}")]
    if not docs:
        return [], [Problem(source, 0, "", "no YAML documents found")]
    jobs: list[MixedPrecisionJob] = []
    problems: list[Problem] = []
    for i, doc in enumerate(docs):
        job, found = check_document(doc, source, i)
        problems += found
        if job is not None:
            jobs.append(job)
    return jobs, problems


def load_job(path: Path) -> MixedPrecisionJob:
    """The one MixedPrecisionJob in a file, or InvalidManifest naming every problem."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise InvalidManifest([Problem(str(path), 0, "", f"cannot read: {exc.strerror}")]) from exc
    jobs, problems = check_text(text, str(path))
    if problems:
        raise InvalidManifest(problems)
    if len(jobs) != 1:
        raise InvalidManifest([Problem(str(path), 0, "", f"expected one MixedPrecisionJob, found {len(jobs)}")])
    return jobs[0]
