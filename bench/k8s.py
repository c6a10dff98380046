"""The few API calls the cluster benchmarks make, typed: the kubernetes client declares a custom
object as `object` and a request body as its model class, and these say what the benchmarks
read and send."""

from __future__ import annotations

from typing import Any, cast

from kubernetes import client

from mpjob_contract.api import GROUP, PLURAL, VERSION


def new_namespace(core: client.CoreV1Api, name: str, labels: dict[str, str] | None = None) -> str:
    """Create the namespace `name` (with `labels`); its name."""
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels=labels)))
    return name


def mpjob(custom: client.CustomObjectsApi, ns: str, name: str) -> dict[str, Any]:
    """The MixedPrecisionJob `name` of `ns`, as the API server returns it."""
    return cast(dict[str, Any], custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name))


def mpjobs(custom: client.CustomObjectsApi, ns: str) -> list[dict[str, Any]]:
    """The MixedPrecisionJobs of `ns`, as the API server lists them."""
    return list(cast(dict[str, Any], custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL))["items"])
