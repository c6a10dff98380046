"""With kopf peering (peering.enabled) a rolling upgrade starts the new operator beside the
old one: the peers see each other in the KopfPeering object, the old one leaves, the new one
takes over the running job."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from kubernetes import client

from mpjob.controller.config import Peering
from mpjob.controller.peering import outranked
from tests.e2e.conftest import Cli, Jobs, Release, endless
from tests.helpers import wait_for

pytestmark = pytest.mark.e2e

SELECTOR = "app.kubernetes.io/component=operator,app.kubernetes.io/instance=mpjob"


def test_rolling_upgrade_hands_a_running_job_to_the_new_peer(
    release: Release, cli: Cli, jobs: Jobs, core: client.CoreV1Api, custom: client.CustomObjectsApi
) -> None:
    release.values.append("peering.enabled=true")
    cli.helm("install", release.name, *release.install_args())
    release.installed = True

    def peers() -> set[str]:
        obj = custom.get_namespaced_custom_object("kopf.dev", "v1", release.namespace, "kopfpeerings", "mpjob")
        return {name for name, peer in (obj.get("status") or {}).items() if peer}

    (old,) = core.list_namespaced_pod(release.namespace, label_selector=SELECTOR).items
    wait_for(lambda: peers() == {old.metadata.name}, 60, message="the operator in the peering")

    jobs.apply(endless("handover"))
    wait_for(lambda: jobs.status("handover").get("step", 0) > 0, 180, interval=1, message="handover progressing")

    cli.helm("upgrade", release.name, *release.install_args("--set", "operator.tickSeconds=3"))
    (new,) = wait_for(
        lambda: [
            p
            for p in core.list_namespaced_pod(release.namespace, label_selector=SELECTOR).items
            if p.metadata.uid != old.metadata.uid and p.metadata.deletion_timestamp is None
        ],
        120,
        message="the new operator pod",
    )
    wait_for(lambda: peers() == {new.metadata.name}, 120, message="only the new operator left in the peering")
    # The peering object as kopf wrote it reads, to the operator's own check, as kopf reads it:
    # the new peer is the only live one, so it acts.
    obj = custom.get_namespaced_custom_object("kopf.dev", "v1", release.namespace, "kopfpeerings", "mpjob")
    entry = obj["status"][new.metadata.name]
    assert set(entry) == {"priority", "lifetime", "lastseen"}, entry
    me = Peering(name="mpjob", identity=new.metadata.name, priority=entry["priority"], clusterwide=False)
    assert not outranked(obj["status"], peering=me, now=datetime.now(UTC))
    before = jobs.status("handover")["step"]
    wait_for(lambda: jobs.status("handover")["step"] > before, 120, interval=1, message="progress under the new peer")
    cli.kubectl(
        "patch",
        "-n",
        release.namespace,
        "mpj",
        "handover",
        "--type=merge",
        "-p",
        '{"spec":{"runPolicy":{"suspend":true}}}',
    )
    status = jobs.wait_phase("handover", ("Suspended",), 180)
    assert len(status["attempts"]) == 1
