"""Documents of other kinds beside the jobs in a manifest file (a PersistentVolumeClaim applied
with them): `mpjob validate` names them as skipped instead of refusing them (validation.check_text
given a list to put them in); `mpjob run` still takes one MixedPrecisionJob and nothing else."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mpjob_contract.api import GROUP, KIND


@dataclass(frozen=True)
class Skipped:
    """A document of another kind beside the jobs (a PersistentVolumeClaim, a Secret): named, not checked."""

    source: str
    document: int
    kind: str
    name: str

    def __str__(self) -> str:
        where = (self.source or "''") + (f" (document {self.document + 1})" if self.document else "")
        return f"{where}: skipped: {' '.join(filter(None, (self.kind, self.name)))} (not a {KIND})"


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
    name = (doc.get("metadata") or {}).get("name") if isinstance(doc.get("metadata"), dict) else None
    return Skipped(source, index, kind, name if isinstance(name, str) else "")
