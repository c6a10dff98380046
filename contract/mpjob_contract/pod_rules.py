"""The pod API's rules between a toleration's fields, as cross-field rules of the API (the table
is mpjob_contract.rules): the API server refuses them only when the Job controller creates the
pod, long after the job was accepted. A toleration's single fields (key, value, operator,
effect) are held by the template's Kubernetes schemas (mpjob.k8s_openapi.VALUE_RULES), which
also bound the strings these rules compare, so their CEL stays within the API server's budget.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mpjob_contract.cel import Rule

#: Where each toleration's rules sit.
TOLERATION = "spec.template.tolerations[]"


def _field(toleration: Any, name: str) -> Any:
    return toleration.get(name) if isinstance(toleration, Mapping) else None


TOLERATION_SECONDS_NEED_NO_EXECUTE = Rule(
    name="toleration-seconds-need-no-execute",
    path=TOLERATION,
    cel="!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
    message="template.tolerations[].effect must be NoExecute when tolerationSeconds is set: only a NoExecute "
    "taint evicts a running pod, after tolerationSeconds",
    holds=lambda t: _field(t, "tolerationSeconds") is None or _field(t, "effect") == "NoExecute",
    field_path=".effect",
)
TOLERATION_EMPTY_KEY_EXISTS = Rule(
    name="toleration-empty-key-exists",
    path=TOLERATION,
    cel="(has(self.key) && self.key != '') || (has(self.operator) && self.operator == 'Exists')",
    message="template.tolerations[].operator must be Exists when key is empty (a toleration of every taint); "
    "name the taint's key to match a value",
    holds=lambda t: bool(_field(t, "key")) or _field(t, "operator") == "Exists",
    field_path=".operator",
)
TOLERATION_EXISTS_WITHOUT_VALUE = Rule(
    name="toleration-exists-without-value",
    path=TOLERATION,
    cel="!has(self.operator) || self.operator != 'Exists' || !has(self.value) || self.value == ''",
    message="template.tolerations[].value must be empty when operator is Exists (it matches every value of "
    "the key); use operator Equal to match this value",
    holds=lambda t: _field(t, "operator") != "Exists" or not _field(t, "value"),
    field_path=".value",
)
#: A toleration's rules, in the order the CRD lists them.
TOLERATION_RULES = (TOLERATION_SECONDS_NEED_NO_EXECUTE, TOLERATION_EMPTY_KEY_EXISTS, TOLERATION_EXISTS_WITHOUT_VALUE)
