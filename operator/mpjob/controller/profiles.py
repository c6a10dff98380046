"""Profiles on demand, acted on: read the job's `mpjob.dev/profile-steps` annotation, let
`planning/profiles.py` decide, write status.profiles (at the resourceVersion the reconcile holds,
as every status write: one refused with a 409 leaves the body the reconcile held stale, so the
job's next reconcile reads it anew and plans it again, its Events told then) and the Events, and
ask the running attempt's rank 0 over its metrics port (`POST /profile?id=ID&steps=N`).

The trainer holds no Kubernetes token, so the request travels over the one connection the
operator already makes to the pod: rank 0's metrics port, which the attempt's NetworkPolicy
opens to the operator. Asks run in a small pool of their own, each bounded by the scrape
deadline and MAX_ANSWER_BYTES (`scrape.fetch`), one per job at a time; a reconcile only hands
an ask over and takes the answer that came back since, so a slow pod never holds a reconcile.
Each ask carries the job's profile token (builders.profile_token: one for all its attempts),
which only this operator can derive. Asks and answers are keyed by the job's UID, never its
namespace/name: a job deleted and created again under the same name is never handed the old
one's answer. Rank 0 refusing the token (401: its pods hold another, from a Secret of the
job's name this operator did not make, an attempt an older one began, or a key since changed;
403: they hold none) is a final answer: the profile is recorded Refused, saying why, and never
asked again: the attempt's pods hold that token for as long as they run.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, cast

import kopf
from kubernetes.client.rest import ApiException
from pydantic import ValidationError

from mpjob.builders.profile_token import job_token
from mpjob.controller.actions import write_patch
from mpjob.controller.cache import Observed
from mpjob.controller.cluster import CONFLICT, Cluster
from mpjob.controller.records import Key
from mpjob.controller.scrape import ScrapeError, fetch
from mpjob.planning import history
from mpjob.planning import status as st
from mpjob.planning.profiles import ProfileAsk, plan_profiles
from mpjob_contract import metrics as tm
from mpjob_contract.api import MixedPrecisionJobSpec, MixedPrecisionJobStatus
from mpjob_contract.launch import checkpoint_root, job_checkpoint_dir
from mpjob_contract.tracking import MAX_ANSWER_BYTES, PROFILE_ANNOTATION, PROFILE_PATH, ProfileAnswer

log = logging.getLogger("mpjob.operator.profiles")

#: Rank 0's answers that refuse the ask for its token, for good: what the profile's entry says.
TOKEN_REFUSALS = {
    401: "rank 0 refused the job's profile token (401): the attempt's pods hold another (a Secret "
    "of the job's name this operator did not make, an attempt an older operator began, or the "
    "operator's profile key changed since the attempt began)",
    403: "the attempt's pods hold no profile token (403): its Secret was refused or is missing",
}


class ProfileRequests:
    """The annotation -> status.profiles -> rank 0, for every job this operator reconciles."""

    def __init__(
        self, cluster: Cluster, deadline: float, key: bytes, *, threads: int = 2, port: int = tm.DEFAULT_METRICS_PORT
    ) -> None:
        self.cluster, self.deadline, self.key, self.port = cluster, deadline, key, port
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="mpjob-profiles")
        self._lock = threading.Lock()
        #: By the job's UID.
        self._busy: set[str] = set()
        self._answers: dict[str, ProfileAnswer] = {}

    def reconcile(
        self, body: dict[str, Any], spec: MixedPrecisionJobSpec, status: MixedPrecisionJobStatus, seen: Observed
    ) -> bool:
        """The job's profiles after its annotation and rank 0's last answer; the next ask. The
        path recorded is below the job's checkpoint folder in its store (the bucket's URL for
        a job whose checkpoints are in a bucket), where the trainer writes it. False when the
        write was refused with a 409: `body` is behind the job (its next reconcile reads it)."""
        meta = body["metadata"]
        key: Key = (meta["namespace"], meta["name"])
        annotation = (meta.get("annotations") or {}).get(PROFILE_ANNOTATION)
        if annotation is None and not status.profiles:
            return True
        uid = str(meta["uid"])
        with self._lock:
            answer = self._answers.pop(uid, None)
        folder = job_checkpoint_dir(namespace=key[0], name=key[1], uid=meta["uid"], root=checkpoint_root(spec))
        now = st.now()
        plan = plan_profiles(status, annotation, checkpoint_dir=folder, now=now, answer=answer)
        if plan.profiles != status.profiles:
            try:  # at the version the reconcile holds, as its own writes: never over a newer status
                write_patch(self.cluster, body, {"profiles": [p.to_api() for p in plan.profiles]})
            except ApiException as exc:
                self._keep(uid, answer)  # the next reconcile plans it again from a new read, told nothing now
                if exc.status != CONFLICT:
                    raise
                log.info("%s/%s: profiles not written (the job changed since it was read): next tick", *key)
                return False
            status.profiles = plan.profiles
        for event in plan.events:
            kopf.event(cast(kopf.Body, body), type=event.type, reason=event.reason, message=event.message)
        if plan.ask is None:
            return True
        job = history.job_index(status, plan.ask.attempt)  # an attempt begun in place: its chain's pods
        if ip := seen.rank0_ip.get(job):
            self._submit(key, uid, replace(plan.ask, attempt=job), ip)
        return True

    def _keep(self, uid: str, answer: ProfileAnswer | None) -> None:
        """Hand `answer` back for the next reconcile (unless a newer one came meanwhile)."""
        if answer is not None:
            with self._lock:
                self._answers.setdefault(uid, answer)

    def _submit(self, key: Key, uid: str, ask: ProfileAsk, ip: str) -> None:
        with self._lock:
            if uid in self._busy:
                return
            self._busy.add(uid)
        self._pool.submit(self._ask, key, uid, ask, ip)

    def _ask(self, key: Key, uid: str, ask: ProfileAsk, ip: str) -> None:
        path = f"{PROFILE_PATH}?id={ask.id}&steps={ask.steps}"
        answer = None
        try:
            token = job_token(self.key, uid=uid)
            bound, post = MAX_ANSWER_BYTES, "POST"
            text = fetch(ip, self.port, path=path, deadline=self.deadline, max_bytes=bound, method=post, bearer=token)
            answer = ProfileAnswer.model_validate_json(text)
        except ScrapeError as exc:
            if (refused := TOKEN_REFUSALS.get(exc.status or 0)) is not None:
                answer = ProfileAnswer(id=ask.id, state="Refused", message=refused)
            log.info("asking %s/%s's rank 0 for profile %d: %s", *key, ask.id, str(exc)[:200])
        except ValidationError as exc:
            log.info("asking %s/%s's rank 0 for profile %d: %s", *key, ask.id, str(exc)[:200])
        except Exception:  # a bug here must not leave the job busy for good
            log.exception("asking %s/%s's rank 0 for profile %d failed", *key, ask.id)
        finally:
            with self._lock:
                self._busy.discard(uid)
                if answer is not None:
                    self._answers[uid] = answer

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
