"""The MixedPrecisionJob CRD installed in the cluster, checked against this release's at start.

The API server prunes every spec field its CRD's schema does not name (the status keeps unknown
fields: the operator's memory is never pruned). On a CRD older than the operator, `kubectl
apply` refuses a job that sets a field of this release's (kubectl's strict field validation),
and a client that does not ask for it loses the field without a word: the job then runs
without, say, its runPolicy.progressDeadlineSeconds. This happens after a `helm upgrade`, which
never upgrades a chart's `crds/`. So `mpjob operator` reads the installed CRD as it starts and,
when it lacks a field of this release's, logs a warning naming them and how to apply the CRD.
It starts all the same: what the CRD refuses the operator refuses too (it reads every spec
through the same models), and the jobs that run need it.

A CRD newer than the operator (a rollback) has more fields, not fewer: it passes. A part of the
installed schema that keeps unknown fields (x-kubernetes-preserve-unknown-fields) prunes
nothing below it. A CRD that cannot be read (not installed yet, or the operator may not read
it: rbac.clusterReader off) is logged and not checked: kopf waits for the resource.
"""

from __future__ import annotations

import logging
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException
from urllib3.exceptions import HTTPError

from mpjob import crd as generator
from mpjob.controller.cluster import load_credentials, raw
from mpjob_contract import api

log = logging.getLogger("mpjob.operator")
#: The CRD this operator serves.
NAME = f"{api.PLURAL}.{api.GROUP}"

#: How many missing fields the warning names (the rest are counted).
NAMED = 8


def at_start(name: str = NAME) -> str | None:
    """The warning `mpjob operator` logs as it starts on the CRD installed as `name` (None: it fits,
    or it cannot be read, which is logged too)."""
    load_credentials()
    extensions = client.ApiextensionsV1Api()
    try:
        installed = raw(extensions.read_custom_resource_definition, name)
    except (ApiException, HTTPError, OSError) as exc:
        why = f"HTTP {exc.status}" if isinstance(exc, ApiException) else repr(exc)
        log.warning("cannot read the CRD %s to check its fields (%s): starting unchecked", name, why)
        return None
    found = problems(installed)
    if not found:
        return None
    said = outdated(name, found)
    log.warning("%s", said)
    return said


def missing_fields(expected: dict[str, Any], installed: dict[str, Any], path: str = "") -> list[str]:
    """The fields of the `expected` schema that the `installed` one would prune, as paths
    (`spec.runPolicy.progressDeadlineSeconds`, `status.attempts[].progressTime`, a map's values
    as `{}`): where a field is missing, not what lies below it."""
    if installed.get("x-kubernetes-preserve-unknown-fields") is True:
        return []
    found: list[str] = []
    have = installed.get("properties") or {}
    for name, below in (expected.get("properties") or {}).items():
        where = f"{path}.{name}" if path else name
        if name not in have:
            found.append(where)
        else:
            found += missing_fields(below, have[name], where)
    for key, mark in (("items", "[]"), ("additionalProperties", "{}")):
        want, got = expected.get(key), installed.get(key)
        if isinstance(want, dict):
            found += missing_fields(want, got, path + mark) if isinstance(got, dict) else [path + mark]
    return found


def problems(installed: dict[str, Any], expected: dict[str, Any] | None = None) -> list[str]:
    """What makes the `installed` CRD unfit for this operator (empty: it fits): the version it
    serves, its status subresource, the fields its schema lacks (`expected`: this release's)."""
    want = _version(expected or generator.crd())
    assert want is not None, "this release's CRD serves one version"
    have = _version(installed, want["name"])
    if have is None or have.get("served") is not True:
        return [f"it does not serve version {want['name']}"]
    found = [] if "status" in (have.get("subresources") or {}) else ["it has no status subresource"]
    lacking = missing_fields(_schema(want), _schema(have))
    if lacking:
        more = f" and {len(lacking) - NAMED} more" if len(lacking) > NAMED else ""
        found.append(f"it lacks {', '.join(lacking[:NAMED])}{more}")
    return found


#: kubectl's arguments that apply a release's CRD over the installed one. --force-conflicts: the
#: installed CRD's fields belong to whoever made it (helm, which installs a chart's crds/), and
#: a server-side apply of other values for them is otherwise refused with a conflict.
APPLY = ("apply", "--server-side", "--force-conflicts")


def outdated(name: str, found: list[str]) -> str:
    """What `mpjob operator` says of the CRD `name` that lacks what `found` lists."""
    return (
        f"the installed CustomResourceDefinition {name} is older than this operator: {'; '.join(found)}. "
        "kubectl refuses a job that sets those fields, and other clients lose them. Apply this "
        f"release's CRD first: kubectl {' '.join(APPLY)} -f crds/{name}.yaml (the chart's copy "
        f"is helm/mpjob/crds/{name}.yaml; `helm upgrade` does not upgrade a chart's crds/)"
    )


def _version(crd: dict[str, Any], name: str | None = None) -> dict[str, Any] | None:
    versions = (crd.get("spec") or {}).get("versions") or []
    return next((v for v in versions if isinstance(v, dict) and (name is None or v.get("name") == name)), None)


def _schema(version: dict[str, Any]) -> dict[str, Any]:
    return ((version.get("schema") or {}).get("openAPIV3Schema")) or {}
