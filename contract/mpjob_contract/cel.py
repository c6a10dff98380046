"""One cross-field rule of the API: where it sits in the schema, its CEL, its message and the
same rule in Python (the table of them is mpjob_contract.rules)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from mpjob_contract import k8s


@dataclass(frozen=True)
class Rule:
    """One cross-field rule: where it sits in the schema, its CEL, its message, its Python check."""

    #: Names the rule in tests and in the bad-manifest cases.
    name: str
    #: The schema node the rule is attached to: dotted camelCase from the object's root ("" is
    #: the object itself); `name[]` is each item of the list `name`.
    path: str
    #: The CEL expression, over `self` (the node at `path`).
    cel: str
    #: What both the API server and `mpjob validate` say when the rule is broken.
    message: str
    #: The same rule in Python, over the same `self` (see mpjob_contract.rules' docstring).
    holds: Callable[[Any], bool]
    #: The field below `path` the error names (CEL's fieldPath, e.g. ".readOnly"); "" names `path`.
    field_path: str = ""
    #: The API server's reason (e.g. FieldValueForbidden); "" is its default, FieldValueInvalid.
    reason: str = ""
    #: The item below the fieldPath the Python check names (`[1]`), from the same `self`: CEL's
    #: fieldPath cannot index a list, so the API server names the list and `mpjob validate` its item.
    item: Callable[[Any], str] | None = None

    def x_kubernetes_validation(self) -> dict[str, str]:
        """The rule as one entry of the CRD's `x-kubernetes-validations`."""
        entry = {"rule": self.cel, "message": self.message}
        if self.field_path:
            entry["fieldPath"] = self.field_path
        if self.reason:
            entry["reason"] = self.reason
        return entry

    def violation(self, value: Any, at: str = "") -> tuple[str, str] | None:
        """(field, message) when `value` breaks the rule; the field is `at` plus the fieldPath."""
        if self.holds(value):
            return None
        item = self.item(value) if self.item is not None else ""
        return f"{at}{self.field_path}{item}".lstrip("."), self.message

    def check(self, value: Any) -> None:
        """Raise when `value` breaks the rule, naming the fieldPath's field when there is one."""
        found = self.violation(value)
        if found is None:
            return
        if found[0]:
            raise k8s.SchemaViolations([found])
        raise ValueError(self.message)


def wire_self(model: BaseModel) -> dict[str, Any]:
    """A model as a rule's `self` sees it: its set fields by wire name (values as they are)."""
    fields = type(model).model_fields
    return {field.alias or name: value for name, field in fields.items() if (value := getattr(model, name)) is not None}


@dataclass(frozen=True)
class Transition:
    """A rule on an update, over `self` (the node at `path` as the update would store it) and
    `oldSelf` (as stored): the API server refuses an update that breaks it. A manifest alone
    cannot break one, so `mpjob validate` has nothing to check; the API server evaluates it only
    where both the old and the new object have the node."""

    #: The schema node the rule is attached to, as `Rule.path`.
    path: str
    #: The CEL expression, over `self` and `oldSelf`.
    cel: str
    #: What the API server says when an update breaks the rule.
    message: str
    #: The field below `path` the error names, as `Rule.field_path`.
    field_path: str = ""

    def x_kubernetes_validation(self) -> dict[str, str]:
        """The rule as one entry of the CRD's `x-kubernetes-validations`."""
        entry = {"rule": self.cel, "message": self.message}
        if self.field_path:
            entry["fieldPath"] = self.field_path
        return entry
