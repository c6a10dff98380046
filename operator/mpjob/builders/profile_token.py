"""The job's profile token: what lets the operator, and nobody else the attempt's NetworkPolicy
admits to the metrics port, ask rank 0 for a profile (`POST /profile`).

The token is derived, not stored: HMAC-SHA256 of the operator's profile key over the job's UID,
so a restarted operator (or another replica) computes the same one and the status never holds
it. The pods get it from one Secret per job (`<job>-profile`, owned by the MixedPrecisionJob so
it goes with the job), created before each attempt's Job (once: an existing Secret of the name
is left as it is), as the env var `PROFILE_TOKEN_ENV` through a secretKeyRef: the kubelet fills
it in. So a job holds one such Secret whatever its number of attempts: the operator may only
create Secrets, never delete one, and a Secret an attempt made would outlive the attempt's Job,
its Service and NetworkPolicy, which go when the job keeps no more of its attempts. A value in
the pod's own env would be readable by whoever may read pods, which a monitoring stack's service
account usually may; a Secret it usually may not. The operator only creates these Secrets and
never reads one: a Secret of the name it did not make (a job named `x-a1` beside an older
operator's Secret for job `x`'s attempt 1) is left as it is, its pods get whatever it holds, and
rank 0 refuses the operator's asks (401): the profiles are recorded Refused in status.profiles,
saying why (`controller.profiles`), and the attempt runs on. Attempts begun by an operator
that made one Secret per attempt keep theirs, with its token: profiles asked of them are refused
until the next attempt begins. The key comes from the operator's environment
(`MPJOB_PROFILE_KEY`, the chart's Secret); without one it draws a random key when it starts, and
attempts begun before a restart can then no longer be profiled.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from typing import Any

from mpjob_contract.tracking import PROFILE_TOKEN_ENV, PROFILE_TOKEN_KEY


def job_token(key: bytes, *, uid: str) -> str:
    """The profile token of the job whose UID is `uid` (every attempt's)."""
    return hmac.new(key, f"mpjob-profile/{uid}".encode(), hashlib.sha256).hexdigest()


def secret_name(job: str) -> str:
    """The profile-token Secret of the MixedPrecisionJob named `job`."""
    return f"{job}-profile"


def job_profile_secret(job: str, namespace: str, labels: dict[str, str], token: str) -> dict[str, Any]:
    """The Secret that hands the pods of every attempt of the job named `job` its profile token."""
    meta = {"name": secret_name(job), "namespace": namespace, "labels": dict(labels)}
    data = {PROFILE_TOKEN_KEY: base64.b64encode(token.encode()).decode()}
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "metadata": meta, "data": data}


def token_env(job: str) -> dict[str, Any]:
    """The trainer container's env entry that carries the token of the job named `job` (optional:
    an attempt whose Secret is missing answers no profile request, and runs)."""
    ref = {"name": secret_name(job), "key": PROFILE_TOKEN_KEY, "optional": True}
    return {"name": PROFILE_TOKEN_ENV, "valueFrom": {"secretKeyRef": ref}}
