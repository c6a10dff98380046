"""A container's environment as the kubelet makes it: every key of envFrom's ConfigMaps and
Secrets (with their prefix), then env in order: literals (`$(NAME)` expanded, paths rewritten),
fieldRefs, ConfigMap and Secret keys.

A ConfigMap or Secret, or a key of one, that is not there and not `optional` raises
`ContainerConfigError` in the kubelet's words (`secret "x" not found`, `couldn't find key K in
Secret ns/x`): the pod waits with CreateContainerConfigError and is tried again (pods.py). The
agent once failed such a pod at once, with the API's whole 404 as its message.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

from kubernetes.client.rest import ApiException

from tests.cluster.nodeagent.downward import field_value


class ContainerConfigError(Exception):
    """The container's environment cannot be made yet (the kubelet's CreateContainerConfigError)."""


def container_env(core: Any, pod: Any, ctr: Any, *, ip: str, rewrite: Callable[[str], str]) -> dict[str, str]:
    """The variables the container's envFrom and env define; raises ContainerConfigError."""
    namespace = pod.metadata.namespace
    defined: dict[str, str] = {}
    for source in ctr.env_from or []:
        kind, ref = ("Secret", source.secret_ref) if source.secret_ref else ("ConfigMap", source.config_map_ref)
        data = referenced_data(core, kind, ref.name, namespace, optional=bool(ref.optional)) or {}
        defined.update({f"{source.prefix or ''}{key}": value for key, value in data.items()})
    for var in ctr.env or []:
        source = var.value_from
        if var.value is not None:
            value: str | None = rewrite(kubelet_expand(var.value, defined))
        elif source and source.field_ref:
            value = field_value(pod, source.field_ref.field_path, ip)
        elif source and (source.secret_key_ref or source.config_map_key_ref):
            kind = "Secret" if source.secret_key_ref else "ConfigMap"
            value = key_value(core, kind, source.secret_key_ref or source.config_map_key_ref, namespace)
        else:
            value = None
        if value is not None:
            defined[var.name] = value
    return defined


def referenced_data(core: Any, kind: str, name: str, namespace: str, *, optional: bool) -> dict[str, str] | None:
    """ConfigMap or Secret `name`'s data (a Secret's decoded); None when it is missing and the
    reference is optional (the kubelet leaves its variables unset)."""
    read = core.read_namespaced_secret if kind == "Secret" else core.read_namespaced_config_map
    try:
        data = read(name, namespace).data or {}
    except ApiException as exc:
        if exc.status != 404:
            raise
        if optional:
            return None
        raise ContainerConfigError(f'{kind.lower()} "{name}" not found') from None
    if kind == "Secret":
        return {key: base64.b64decode(value).decode() for key, value in data.items()}
    return dict(data)


def key_value(core: Any, kind: str, ref: Any, namespace: str) -> str | None:
    """One key of a ConfigMap or Secret; None when it (or its object) is missing and optional."""
    data = referenced_data(core, kind, ref.name, namespace, optional=bool(ref.optional))
    if data is None or (ref.key not in data and ref.optional):
        return None
    if ref.key not in data:
        raise ContainerConfigError(f"couldn't find key {ref.key} in {kind} {namespace}/{ref.name}")
    return data[ref.key]


def kubelet_expand(text: str, defined: dict[str, str]) -> str:
    """An env value as the kubelet expands it: `$$` is `$`; `$(NAME)` is NAME's value when an entry
    before it defines it, else left as written; any other `$` stays."""
    out, i = [], 0
    while i < len(text):
        if text.startswith("$$", i):
            out.append("$")
            i += 2
        elif text.startswith("$(", i) and (end := text.find(")", i + 2)) >= 0:
            name = text[i + 2 : end]
            out.append(defined.get(name, text[i : end + 1]))
            i = end + 1
        else:
            out.append(text[i])
            i += 1
    return "".join(out)
