"""Documents of other kinds beside the jobs in a manifest file (a PersistentVolumeClaim applied
with them): `mpjob validate` names them as skipped instead of refusing them (validation.check_text
given a list to put them in); `mpjob run` still takes one MixedPrecisionJob and nothing else,
refusing each of them in one problem that says what it is (`Skipped.refused`; a List, even of one
job, what it holds: `Listed.refused`).

A `kind: List` (`kubectl get -o yaml` of several objects) is set aside with them as a `Listed`,
and `mpjob validate` then checks its items as documents of their own (`listed_items`)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from mpjob_contract.api import GROUP, KIND

if TYPE_CHECKING:  # validation imports this module for check_text: its checks are passed in
    from collections.abc import Callable

    from mpjob.validation import Problem
    from mpjob_contract.api import MixedPrecisionJob


@dataclass(frozen=True)
class Skipped:
    """A document of another kind beside the jobs (a PersistentVolumeClaim, a Secret): named, not checked."""

    source: str
    document: int
    kind: str
    name: str
    #: Its index among a List's items (None: a document of its own).
    item: int | None = None

    def __str__(self) -> str:
        where = (self.source or "''") + (f" (document {self.document + 1})" if self.document else "")
        where += f" items[{self.item}]" if self.item is not None else ""
        return f"{where}: skipped: {' '.join(filter(None, (self.kind, self.name)))} (not a {KIND})"

    def refused(self) -> str:
        """Why `mpjob run` refuses it: what it is, not its apiVersion and kind as fields to change (it
        is no job written wrong, and a local run has no use for it: not even a checkpoint volume's claim)."""
        return (
            f"a {' '.join(filter(None, (self.kind, self.name)))}, not a {KIND}: `mpjob run` takes a file of one "
            f"{KIND} and nothing else; give it the job's own file (apply the other objects with kubectl)"
        )


@dataclass(frozen=True)
class Listed(Skipped):
    """A `kind: List` document: not a job itself, its items are checked one by one (`listed_items`)."""

    items: tuple[Any, ...] = ()

    def refused(self) -> str:
        """Why `mpjob run` refuses it: it runs one MixedPrecisionJob, from that job's own manifest."""
        jobs = sum(1 for item in self.items if isinstance(item, dict) and other_kind(item) is None)
        return (
            f"a List of {len(self.items)} item(s), {jobs} of them {KIND}(s): `mpjob run` runs one {KIND}; "
            "give it the job's own manifest (kubectl get mpj NAME -o yaml)"
        )


def listed_items(
    skipped: list[Skipped], check: Callable[[Any, str, int], tuple[MixedPrecisionJob | None, list[Problem]]]
) -> tuple[list[MixedPrecisionJob], list[Problem]]:
    """The jobs and problems of the Lists among `skipped`, each item checked by `check` as a
    document (a problem's field then starts items[i]); each List is replaced in `skipped` by its
    items of other kinds."""
    jobs: list[MixedPrecisionJob] = []
    problems: list[Problem] = []
    for listed in [s for s in skipped if isinstance(s, Listed)]:
        others: list[Skipped] = []
        for i, item in enumerate(listed.items):
            if (other := other_kind(item, listed.source, listed.document)) is not None:
                others.append(replace(other, item=i))
                continue
            job, found = check(item, listed.source, listed.document)
            problems += [replace(p, field=f"items[{i}]" + (f".{p.field}" if p.field else "")) for p in found]
            jobs += [job] if job is not None else []
        at = skipped.index(listed)
        skipped[at : at + 1] = others
    return jobs, problems


def other_kind(doc: Any, source: str = "<input>", index: int = 0) -> Skipped | None:
    """The document as a Skipped when it is plainly an object of another kind: an apiVersion outside
    mpjob's group and a kind that is not MixedPrecisionJob in any case. A document that may be meant
    as a MixedPrecisionJob (no kind, a kind in another case, mpjob's group) is None: checked as one."""
    if not isinstance(doc, dict):
        return None
    kind, api_version = doc.get("kind"), doc.get("apiVersion")
    if not (isinstance(kind, str) and kind and isinstance(api_version, str) and api_version):
        return None
    if kind.lower() == KIND.lower() or api_version.split("/")[0] == GROUP:
        return None
    if (kind, api_version) == ("List", "v1") and isinstance(items := doc.get("items"), list):
        return Listed(source, index, kind, "", items=tuple(items))
    name = (doc.get("metadata") or {}).get("name") if isinstance(doc.get("metadata"), dict) else None
    return Skipped(source, index, kind, name if isinstance(name, str) else "")
