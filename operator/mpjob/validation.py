"""Manifest checking with the same models the CRD is generated from.

`check_text` returns every problem at once, each naming its field path (camelCase, as the
user wrote it) and what is allowed; YAML syntax errors name the line. Values are held to the
CRD's types first (mpjob.structural: the models alone would read "2" as 2). The template's pod
fields are checked against Kubernetes' own schemas (mpjob_contract.k8s), as the API server
does. A manifest is untrusted input: it is read only up to MAX_MANIFEST_BYTES, nested at most
MAX_DEPTH deep, and YAML aliases are refused (a few lines of aliases expand to gigabytes).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from typing import Any, cast

import yaml
from pydantic import ValidationError

from mpjob import structural
from mpjob.kinds import Skipped, other_kind
from mpjob.wording import message
from mpjob_contract import k8s
from mpjob_contract.api import API_VERSION, KIND, MixedPrecisionJob
from mpjob_contract.formats import YAML_BOOLEANS
from mpjob_contract.tracking import PROFILE_ANNOTATION, BadProfileRequest, profile_steps

#: Far above any real MixedPrecisionJob, below what the API server takes (3 MiB, etcd 1.5 MiB).
MAX_MANIFEST_BYTES = 1024 * 1024
#: Nesting levels of a YAML document (a real manifest needs about 15).
MAX_DEPTH = 64


@dataclass(frozen=True)
class Problem:
    source: str
    document: int
    field: str
    message: str

    def __str__(self) -> str:
        source = self.source or "''"  # an empty argument (`mpjob run ''`) is named as one
        where = source + (f" (document {self.document + 1})" if self.document else "")
        return f"{where}: {self.field}: {self.message}" if self.field else f"{where}: {self.message}"


class InvalidManifest(Exception):
    def __init__(self, problems: list[Problem]) -> None:
        super().__init__("\n".join(str(p) for p in problems))
        self.problems = problems


class _ManifestLimit(Exception):
    """A document past the limits above; the message says which and where (`field`, when known)."""

    def __init__(self, message: str, *, field: str = "") -> None:
        super().__init__(message)
        self.field = field


#: What a tab where YAML wants indentation needs: PyYAML names the character, not the rule.
TAB_HINT = "YAML indents with spaces only: replace the tab with spaces"


class _BoundedLoader(yaml.SafeLoader):
    """Safe YAML with bounded nesting and no aliases: composing a node recurses, so depth is
    checked there before Python's stack runs out, and an alias would be expanded on output."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._path: list[str] = []  # the field path of the node being composed, one part a level

    def compose_node(self, parent: yaml.Node | None, index: object) -> yaml.Node | None:  # type: ignore[override]
        event = self.peek_event()
        line = f"line {event.start_mark.line + 1}" if event.start_mark else "a node"
        if isinstance(event, yaml.AliasEvent):
            raise _ManifestLimit(f"{line}: YAML aliases (*{event.anchor}) are not allowed; write the value out")
        if len(self._path) >= MAX_DEPTH:
            raise _ManifestLimit(f"{line}: nested deeper than {MAX_DEPTH} levels", field=_abridged(self._path))
        self._path.append(f"[{index}]" if isinstance(index, int) else f".{getattr(index, 'value', '?')}")
        try:
            node = super().compose_node(parent, cast(int, index))  # a key node as `index`: its stub says int
            if isinstance(node, yaml.MappingNode):
                self._once_each(node)
            return node
        finally:
            self._path.pop()

    def _once_each(self, node: yaml.MappingNode) -> None:
        """Refuse a key written twice in one mapping: YAML would keep the last, kubectl refuses it."""
        first: dict[str, int] = {}
        for key, _ in node.value:
            if not isinstance(key, yaml.ScalarNode):
                continue
            line = key.start_mark.line + 1
            if key.value in first:
                raise _ManifestLimit(
                    f"line {line}: {key.value} is written twice in this mapping (first at line {first[key.value]}); "
                    "keep one",
                    field=_abridged([*self._path, f".{key.value}"]),
                )
            first[key.value] = line

    def resolve(self, kind: Any, value: Any, implicit: Any) -> str:
        """A plain scalar's tag as kubectl's reader has it: a date (2024-05-01), base-60 (1:30) or `=` is a string."""
        tag = super().resolve(kind, value, implicit)
        kept = tag.endswith((":timestamp", ":value")) or (tag.endswith((":int", ":float")) and ":" in value)
        return "tag:yaml.org,2002:str" if kept else tag


# kubectl's YAML reader takes 1e-3 and 3e5 as numbers (YAML 1.1's float needs a dot and a signed exponent:
# `mpjob run` handed `task.args: {lr: 1e-3}` to the task as "1e-3") and y and n as booleans, as mpjob does.
_EXPONENT = re.compile(r"^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)[eE][-+]?[0-9]+$")
_BoundedLoader.add_implicit_resolver("tag:yaml.org,2002:float", _EXPONENT, list("-+.0123456789"))
_BoundedLoader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:y|Y|n|N)$"), list("yYnN"))
_BoundedLoader.bool_values = {**yaml.SafeLoader.bool_values, "y": True, "n": False}


def _abridged(parts: list[str], shown: int = 8) -> str:
    """A field path, its first `shown` parts and how many more (a limit's path is long)."""
    path = "".join(parts[1:shown]).lstrip(".")  # parts[0] is the document itself
    return path + (f"... ({len(parts) - shown} levels more)" if len(parts) > shown else "")


def _is_tag(part: Any) -> bool:
    """A union member's tag in an error's location, not a field (a prefix test would drop fields
    such as `strategy`)."""
    tags = ("function-after", "function-before", "str", "int", "constrained-str", "constrained-int")
    return isinstance(part, str) and (part in tags or part.startswith("literal["))


def _path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not _is_tag(part):
            out += ("." if out else "") + str(part)
    return out


def _boolean_keys(doc: Any) -> list[str]:
    """The paths of mapping keys YAML read as booleans (`{on: NumericFault}` has the key true)."""
    found: list[str] = []
    stack: list[tuple[str, Any]] = [("", doc)]
    while stack:
        where, node = stack.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for key, value in items:
            if isinstance(key, bool):
                found.append(f"{where}.{str(key).lower()}".lstrip("."))
            else:
                stack.append((f"{where}[{key}]" if isinstance(node, list) else f"{where}.{key}".lstrip("."), value))
    return sorted(found)


def _header(doc: dict[Any, Any], field: str, wanted: str) -> str:
    """What is wrong with a document's apiVersion or kind, and the line that is right."""
    if doc.get(field) is None:
        return f"missing; it must be {wanted} (write `{field}: {wanted}` at the top of the document)"
    return f"must be {wanted}, got {doc[field]!r}"


def check_document(doc: Any, source: str = "<input>", index: int = 0) -> tuple[MixedPrecisionJob | None, list[Problem]]:
    if not isinstance(doc, dict):
        return None, [Problem(source, index, "", f"expected a mapping (a Kubernetes object), got {type(doc).__name__}")]
    if (other := other_kind(doc, source, index)) is not None:  # `mpjob run`'s: one problem, not two
        return None, [Problem(source, index, "kind", other.refused())]
    problems = [
        Problem(source, index, field, _header(doc, field, wanted))
        for field, wanted in (("apiVersion", API_VERSION), ("kind", KIND))
        if doc.get(field) != wanted
    ]
    if problems:
        return None, problems
    if keys := _boolean_keys(doc):
        why = f"a key read as a boolean: {YAML_BOOLEANS}; quote it (a fault rule's on is now fault)"
        return None, [Problem(source, index, key, why) for key in keys]
    if "spec" in doc:  # as the API server stores it: a null takes the field's default
        doc = {**doc, "spec": structural.without_nulls(doc["spec"])}
    # The CRD's types first: the models would take "2" for an integer, the API server does not.
    mistyped = [Problem(source, index, field, why) for field, why in structural.violations(doc.get("spec"))]
    try:
        # By the wire's (camelCase) names only: the API server knows no other, and a Python name
        # (`run_policy`) would train here what the cluster refuses.
        job = MixedPrecisionJob.model_validate(doc, by_alias=True, by_name=False)
    except ValidationError as exc:
        named = {p.field for p in mistyped}
        return None, mistyped + [p for p in _problems(exc, source, index) if p.field not in named]
    if mistyped:
        return None, mistyped
    annotations = (doc.get("metadata") or {}).get("annotations") or {}
    try:  # annotations are free-form to the API server: this one is checked here and by the operator
        if isinstance(annotations, dict) and PROFILE_ANNOTATION in annotations:
            profile_steps(str(annotations[PROFILE_ANNOTATION]))
    except BadProfileRequest as bad:
        return None, [Problem(source, index, bad.field, bad.why)]
    return job, []


def _problems(exc: ValidationError, source: str, index: int) -> list[Problem]:
    """One Problem per error, a union's members' errors on one field said once: by the member of the
    value's type (-1 is too small, not "not a string"), else by the last (`int | Quantity` says what
    a quantity is); a Kubernetes schema check's violations each name their own field."""
    problems: list[Problem] = []
    member_said: dict[str, tuple[int, bool]] = {}  # a field -> where its member's problem is, and if of type
    for error in exc.errors():
        if error["type"] == "default_factory_not_called":  # a default made from a field refused: said there
            continue
        where = _path(error["loc"])
        cause = (error.get("ctx") or {}).get("error")
        if isinstance(cause, k8s.SchemaViolations):
            problems += [Problem(source, index, f"{where}.{sub}".lstrip("."), why) for sub, why in cause.violations]
            continue
        loc = tuple(part for part in error["loc"] if not _is_tag(part))
        problem, member = Problem(source, index, where, message(error, loc)), any(_is_tag(p) for p in error["loc"])
        mistyped = str(error["type"]).endswith(("_type", "_parsing"))
        if member and where in member_said:
            said, said_mistyped = member_said[where]
            if said_mistyped or not mistyped:
                problems[said], member_said[where] = problem, (said, mistyped)
            continue
        if member:
            member_said[where] = (len(problems), mistyped)
        problems.append(problem)
    return problems


def spec_problems(exc: ValidationError) -> list[str]:
    """A MixedPrecisionJobSpec's validation errors, each as `spec.<field>: what is wrong`."""
    return [f"spec.{p.field}: {p.message}" if p.field else p.message for p in _problems(exc, "", 0)]


def check_text(
    text: str, source: str = "<input>", skipped: list[Skipped] | None = None
) -> tuple[list[MixedPrecisionJob], list[Problem]]:
    """The MixedPrecisionJobs of a manifest and every problem. Given a `skipped` list, documents of
    another kind (other_kind) go there instead of being problems (`mpjob validate`); without one,
    every document must be a MixedPrecisionJob (`mpjob run`)."""
    size = len(text.encode())
    if size > MAX_MANIFEST_BYTES:
        return [], [Problem(source, 0, "", f"manifest is {size} bytes; at most {MAX_MANIFEST_BYTES} are read")]
    try:
        docs = [d for d in yaml.load_all(text, Loader=_BoundedLoader) if d is not None]
    except _ManifestLimit as exc:
        return [], [Problem(source, 0, exc.field, f"YAML refused at {exc}")]
    except yaml.reader.ReaderError as exc:  # a character YAML refuses: it names an offset, not a line
        problem = f"line {text[: exc.position].count(chr(10)) + 1}: unacceptable character #x{exc.character:04x}"
        return [], [Problem(source, 0, "", f"YAML syntax error at {problem}: {exc.reason}")]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        hint = f" ({TAB_HINT})" if "'\\t'" in problem else ""
        return [], [Problem(source, 0, "", f"YAML syntax error at {line}{problem}{hint}")]
    if not docs:
        return [], [Problem(source, 0, "", "no YAML documents found")]
    jobs: list[MixedPrecisionJob] = []
    problems: list[Problem] = []
    for i, doc in enumerate(docs):
        if skipped is not None and (other := other_kind(doc, source, i)) is not None:
            skipped.append(other)
            continue
        job, found = check_document(doc, source, i)
        problems += found
        if job is not None:
            jobs.append(job)
    return jobs, problems


def read_manifest(source: str) -> str:
    """A manifest's text from a file (or `-`, stdin), read no further than the size limit."""
    try:
        if source == "-":
            data = sys.stdin.buffer.read(MAX_MANIFEST_BYTES + 1)
        else:
            with open(source, "rb") as f:
                data = f.read(MAX_MANIFEST_BYTES + 1)
    except OSError as exc:
        raise InvalidManifest([Problem(source, 0, "", f"cannot read: {exc.strerror}")]) from exc
    if len(data) > MAX_MANIFEST_BYTES:
        raise InvalidManifest([Problem(source, 0, "", f"larger than {MAX_MANIFEST_BYTES} bytes; not read further")])
    try:
        return data.decode()
    except UnicodeDecodeError as exc:
        raise InvalidManifest([Problem(source, 0, "", f"not UTF-8 text (byte {exc.start})")]) from exc
