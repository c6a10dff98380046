"""The attempt's profile token: what lets the operator, and nobody else the attempt's
NetworkPolicy admits to the metrics port, ask rank 0 for a profile (`POST /profile`).

The token is derived, not stored: HMAC-SHA256 of the operator's profile key over the job's UID
and the attempt's index, so a restarted operator (or another replica) computes the same one and
the status never holds it. The pods get it from a Secret the operator creates for the attempt
(`<job>-a<N>-profile`, owned by the MixedPrecisionJob so it goes with the job), as the env var
`PROFILE_TOKEN_ENV` through a secretKeyRef: the kubelet fills it in. A value in the pod's own
env would be readable by whoever may read pods, which a monitoring stack's service account
usually may; a Secret it usually may not. The operator only creates these Secrets and never
reads one (an existing Secret of the name is left as it is). The key comes from the operator's
environment (`MPJOB_PROFILE_KEY`, the chart's Secret); without one it draws a random key when it
starts, and attempts begun before a restart can then no longer be profiled.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from typing import Any

from mpjob_contract.tracking import PROFILE_TOKEN_ENV, PROFILE_TOKEN_KEY


def attempt_token(key: bytes, *, uid: str, attempt: int) -> str:
    """The profile token of attempt `attempt` of the job whose UID is `uid`."""
    return hmac.new(key, f"mpjob-profile/{uid}/{attempt}".encode(), hashlib.sha256).hexdigest()


def secret_name(attempt: str) -> str:
    """The Secret of the attempt named `attempt` (builders.attempt.attempt_name)."""
    return f"{attempt}-profile"


def attempt_profile_secret(attempt: str, namespace: str, labels: dict[str, str], token: str) -> dict[str, Any]:
    """The Secret that hands the pods of the attempt named `attempt` its profile token."""
    meta = {"name": secret_name(attempt), "namespace": namespace, "labels": dict(labels)}
    data = {PROFILE_TOKEN_KEY: base64.b64encode(token.encode()).decode()}
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "metadata": meta, "data": data}


def token_env(attempt: str) -> dict[str, Any]:
    """The trainer container's env entry that carries the token (optional: an attempt whose
    Secret is missing answers no profile request, and runs)."""
    ref = {"name": secret_name(attempt), "key": PROFILE_TOKEN_KEY, "optional": True}
    return {"name": PROFILE_TOKEN_ENV, "valueFrom": {"secretKeyRef": ref}}
