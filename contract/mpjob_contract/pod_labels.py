"""The labels the operator puts on an attempt's objects and its trainer pods: the recommended
app labels and the job's, attempt's and precision's, by which the operator, its NetworkPolicy and
`kubectl get pods -l` find an attempt's pods. On a pod they replace the template's own label of the
same key (mpjob.builders.attempt), which `mpjob validate` and the operator warn of
(mpjob_contract.spec_warnings)."""

from __future__ import annotations

from collections.abc import Mapping

APP_NAME, APP_MANAGED_BY = "app.kubernetes.io/name", "app.kubernetes.io/managed-by"
LABEL_JOB = "mpjob.dev/job"
LABEL_ATTEMPT = "mpjob.dev/attempt"
LABEL_PRECISION = "mpjob.dev/precision"
#: What app.kubernetes.io/name and managed-by say on every object the operator makes for a job.
APP_NAME_VALUE, MANAGED_BY_VALUE = "mpjob-trainer", "mpjob"
#: Every label key the operator sets on an attempt's trainer pods.
OPERATOR_POD_LABELS = (APP_NAME, APP_MANAGED_BY, LABEL_JOB, LABEL_ATTEMPT, LABEL_PRECISION)


def replaced_labels(template_labels: Mapping[str, str]) -> list[str]:
    """The template's label keys the operator's own replace on the trainer pods, in its order."""
    return [key for key in OPERATOR_POD_LABELS if key in template_labels]
