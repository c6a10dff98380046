"""Several operator replicas (replicaCount > 1 with peering): the longest-running replica acts,
the others stand by, and a standby takes a running job over when the active one goes."""

from __future__ import annotations

import pytest
from kubernetes import client

from tests.e2e.conftest import Cli, Jobs, Release, endless
from tests.helpers import wait_for

pytestmark = pytest.mark.e2e


def test_two_replicas_one_acts_and_the_standby_takes_over(
    release: Release, cli: Cli, jobs: Jobs, core: client.CoreV1Api, custom: client.CustomObjectsApi
) -> None:
    """replicaCount=2 with peering: the longest-running replica acts, the other stands by; when
    the active one goes, the standby carries the running job on without a second attempt."""
    release.values += ["peering.enabled=true", "replicaCount=2"]
    cli.helm("install", release.name, *release.install_args())
    release.installed = True

    def peers() -> dict[str, int]:
        obj = custom.get_namespaced_custom_object("kopf.dev", "v1", release.namespace, "kopfpeerings", "mpjob")
        return {name: peer["priority"] for name, peer in (obj.get("status") or {}).items() if peer}

    both = wait_for(lambda: len(p := peers()) == 2 and p, 120, message="both replicas in the peering")
    active = max(both, key=lambda name: both[name])  # --priority=oldest: the earlier start wins

    jobs.apply(endless("standby"))
    wait_for(lambda: jobs.status("standby").get("step", 0) > 0, 180, interval=1, message="progress under the active")

    core.delete_namespaced_pod(active, release.namespace)
    wait_for(lambda: active not in peers(), 120, message="the active replica left the peering")
    before = jobs.status("standby")["step"]
    wait_for(lambda: jobs.status("standby")["step"] > before, 120, interval=1, message="progress under the standby")
    status = jobs.status("standby")
    assert [a["index"] for a in status["attempts"]] == [0], "one attempt, never a duplicate"
    assert [
        j.metadata.name
        for j in client.BatchV1Api(core.api_client)
        .list_namespaced_job(release.namespace, label_selector="mpjob.dev/job=standby")
        .items
    ] == ["standby-a0"]
