"""Which pods the operator makes owners of an attempt's NetworkPolicy, and when it writes
(controller/keepers.py): each running pod once, only into a policy its attempt's Job controls,
again after a 409 or a restart, never again after a 403. The policy's lifetime on the real
control plane is tests/integration/operator/test_network_policy.py's."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from mpjob.controller.cache import Observed
from mpjob.controller.cluster import Cluster
from mpjob.controller.keepers import PolicyKeepers
from mpjob.planning.endings import JobView, PodView

pytestmark = pytest.mark.unit

KEY = ("ns", "train")


class Response:
    def __init__(self, body: dict[str, Any]) -> None:
        self.data = json.dumps(body).encode()

    def release_conn(self) -> None:
        pass


class Networking:
    """A NetworkPolicy store of one policy: its reads, and the owners each patch wrote."""

    def __init__(self, controller_uid: str = "job-uid", fail: int | None = None) -> None:
        job = {"apiVersion": "batch/v1", "kind": "Job", "name": "train-a0", "uid": controller_uid, "controller": True}
        self.owners: list[dict[str, Any]] = [job]
        self.fail, self.patches = fail, list[list[str]]()

    def read_namespaced_network_policy(self, name: str, namespace: str, **_: Any) -> Response:
        return Response({"metadata": {"name": name, "resourceVersion": "7", "ownerReferences": self.owners}})

    def patch_namespaced_network_policy(self, name: str, namespace: str, body: dict[str, Any], **_: Any) -> Response:
        if self.fail is not None:
            raise ApiException(status=self.fail, reason="refused")
        assert body["metadata"]["resourceVersion"] == "7"
        self.owners = body["metadata"]["ownerReferences"]
        self.patches.append([ref["uid"] for ref in self.owners])
        return Response({})


def seen(*uids: str, alive: bool = True, finished: str | None = None) -> Observed:
    pods = tuple(PodView(f"p-{u}", 0, "Running", alive, uid=u) for u in uids)
    return Observed({0: JobView(0, finished=finished, pods=pods)}, frozenset(), {}, {0: "job-uid"})


def keepers(networking: Networking) -> PolicyKeepers:
    return PolicyKeepers(Cluster(custom=None, batch=None, core=None, networking=networking))


def test_each_running_pod_is_added_once_beside_the_job() -> None:
    networking = Networking()
    keep = keepers(networking)
    keep.keep(KEY, seen("a"))
    keep.keep(KEY, seen("a"))  # nothing new: no write
    keep.keep(KEY, seen("a", "b"))
    assert networking.patches == [["job-uid", "a"], ["job-uid", "a", "b"]]
    keep.keep(KEY, seen("c", alive=False))  # a pod that has stopped keeps nothing
    keep.keep(KEY, seen("d", finished="Failed"))
    assert len(networking.patches) == 2


def test_a_restarted_operator_adds_them_again_without_doubling_an_owner() -> None:
    networking = Networking()
    keepers(networking).keep(KEY, seen("a"))
    keepers(networking).keep(KEY, seen("a", "b"))
    assert networking.patches[-1] == ["job-uid", "a", "b"]


def test_a_policy_another_job_controls_is_never_written() -> None:
    networking = Networking(controller_uid="someone-else")
    keep = keepers(networking)
    keep.keep(KEY, seen("a"))
    assert networking.patches == []


@pytest.mark.parametrize(("status", "again"), [(409, True), (500, True), (403, False)])
def test_a_refused_write_is_tried_again_at_the_next_reconcile_unless_forbidden(status: int, again: bool) -> None:
    networking = Networking(fail=status)
    keep = keepers(networking)
    keep.keep(KEY, seen("a"))
    networking.fail = None
    keep.keep(KEY, seen("a"))
    assert networking.patches == ([["job-uid", "a"]] if again else [])
