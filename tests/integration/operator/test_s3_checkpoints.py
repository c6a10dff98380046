"""Checkpoints in an S3 bucket through the operator, on the test cluster with its S3 server
(versitygw): credentials from a Secret the operator never reads, the fp16 -> bf16 fallback and a
deleted pod of a two-worker job (no shared volume at all) both resumed from the bucket, and a
wrong credential ending the job Failed, naming the bucket, in one attempt."""

from __future__ import annotations

import base64
import json
from typing import Any

import boto3
import pytest
from kubernetes import client

from tests.cluster.s3 import CREDENTIALS, S3Server
from tests.helpers import wait_for
from tests.integration.operator.conftest import UNTIL_STOPPED, Jobs, Operator, paced_if_until_stopped, pod_events

pytestmark = pytest.mark.integration

ARGS = {"nLayer": 1, "nHead": 2, "nEmbd": 32, "blockSize": 32, "corpusBytes": 20000}


def secret(core: client.CoreV1Api, namespace: str, name: str, **override: str) -> None:
    data = {k: base64.b64encode(v.encode()).decode() for k, v in {**CREDENTIALS, **override}.items()}
    core.create_namespaced_secret(namespace, {"metadata": {"name": name}, "data": data})


def s3_spec(
    server: S3Server, namespace: str, *, steps: int, every: int, secret_name: str = "ckpt-keys"
) -> dict[str, Any]:
    s3 = {
        "bucket": server.bucket,
        "prefix": f"e2e-{namespace}",
        "endpoint": server.endpoint,
        "credentialsSecret": secret_name,
    }
    return {
        "task": {"builtin": "gpt", "args": paced_if_until_stopped(ARGS, steps)},
        "training": {"steps": steps, "batchSize": 4, "logEvery": 5},
        "precision": {"mode": "fp16", "fallback": ["bf16", "fp32"]},
        "checkpoint": {"everySteps": every, "storage": {"s3": s3}},
        "resources": {"gpusPerWorker": 1},
    }


def bucket_client(server: S3Server) -> Any:
    keys = {
        "aws_access_key_id": CREDENTIALS["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
    }
    return boto3.client("s3", endpoint_url=server.endpoint, region_name=server.region, **keys)


def manifests(server: S3Server, prefix: str) -> dict[str, dict[str, Any]]:
    """Committed checkpoints below `prefix`: manifest key -> manifest."""
    c = bucket_client(server)
    found = {}
    for page in c.get_paginator("list_objects_v2").paginate(Bucket=server.bucket, Prefix=f"{prefix}/"):
        for obj in page.get("Contents", []):
            if obj["Key"].endswith("/manifest.json"):
                found[obj["Key"]] = json.loads(c.get_object(Bucket=server.bucket, Key=obj["Key"])["Body"].read())
    return found


def test_fp16_overflow_resumes_in_bf16_from_the_buckets_last_committed_checkpoint(
    operator: Operator, jobs: Jobs, namespace: str, s3_server: S3Server
) -> None:
    secret(jobs.core, namespace, "ckpt-keys")
    spec = s3_spec(s3_server, namespace, steps=60, every=10)
    spec["task"]["args"]["overflowAtStep"] = 25
    spec["precision"]["inPlace"] = False  # a new pod that resumes from the bucket
    jobs.create("recover", spec)
    status = jobs.wait_phase("recover", ("Succeeded", "Failed"), 300)
    assert status["phase"] == "Succeeded", status
    first, second = status["attempts"]
    assert (first["precision"], first["reason"], first["exitCode"]) == ("fp16", "NumericFault", 42)
    assert (second["precision"], second["reason"]) == ("bf16", "Succeeded") and second["startStep"] == 20
    uid = jobs.get("recover")["metadata"]["uid"]
    folder = f"e2e-{namespace}/{namespace}/recover/{uid}"
    assert status["lastCheckpoint"]["path"] == f"s3://{s3_server.bucket}/{folder}/step-000000060"
    # The operator names the bucket checkpoint of the trainer's report for the fallback attempt.
    attempt = jobs.batch.read_namespaced_job("recover-a1", namespace)
    env = {e.name: e.value for e in attempt.spec.template.spec.containers[0].env}
    resume_from = json.loads(env["MPJOB_LAUNCH"])["resumeFrom"]
    assert resume_from == f"s3://{s3_server.bucket}/{folder}/step-000000020"
    committed = manifests(s3_server, folder)
    final = committed[f"{folder}/step-000000060/manifest.json"]
    assert final["files"]["state.pt"]["sha256"] == status["lastCheckpoint"]["sha256"]
    # keep: 3 of its own, older ones pruned; and the fp16 attempt's newest, step 20, which the bf16
    # attempt went on from: no prune deletes another Job's newest (a stray could not tell it from its own)
    assert final["precision"] == "bf16" and len(committed) == 4, sorted(committed)
    assert f"{folder}/step-000000020/manifest.json" in committed


def test_two_workers_without_a_shared_volume_resume_from_the_bucket_after_a_pod_is_deleted(
    operator: Operator, jobs: Jobs, namespace: str, kubeconfig: str, s3_server: S3Server
) -> None:
    secret(jobs.core, namespace, "ckpt-keys")
    spec = s3_spec(s3_server, namespace, steps=UNTIL_STOPPED, every=20)
    spec.update(workers=2, precision={"mode": "bf16", "fallback": ["fp32"]}, resources={"gpusPerWorker": 0})
    jobs.create("evicted", spec)
    wait_for(lambda: manifests(s3_server, f"e2e-{namespace}"), 240, message="a checkpoint in the bucket")
    pods = jobs.core.list_namespaced_pod(namespace, label_selector="mpjob.dev/job=evicted,mpjob.dev/attempt=0")
    volumes = pods.items[0].spec.volumes
    assert not any(v.persistent_volume_claim for v in volumes)  # nothing shared between the pods
    jobs.core.delete_namespaced_pod(pods.items[1].metadata.name, namespace)
    status = wait_for(
        lambda: len((s := jobs.status("evicted")).get("attempts", [])) == 2 and s, 180, message="second attempt"
    )
    assert status["attempts"][1]["precision"] == "bf16"
    resumed = wait_for(lambda: jobs.status("evicted")["attempts"][1]["startStep"], 120, message="resume step")
    assert resumed >= 20
    events = wait_for(
        lambda: [e for e in pod_events(kubeconfig, namespace, "evicted-a1") if e["event"] == "resume"],
        120,
        message="attempt 1 resumed from the bucket",
    )
    assert all(e["path"].startswith(f"s3://{s3_server.bucket}/e2e-{namespace}/") for e in events)
    jobs.patch_spec("evicted", {"runPolicy": {"suspend": True}})  # stop the long run quickly
    jobs.wait_phase("evicted", "Suspended", 90)


def test_a_wrong_credential_fails_the_job_in_one_attempt_naming_the_bucket(
    operator: Operator, jobs: Jobs, namespace: str, s3_server: S3Server
) -> None:
    secret(jobs.core, namespace, "bad-keys", AWS_SECRET_ACCESS_KEY="not-the-secret")
    jobs.create("denied", s3_spec(s3_server, namespace, steps=60, every=10, secret_name="bad-keys"))
    status = jobs.wait_phase("denied", ("Succeeded", "Failed"), 180)
    assert status["phase"] == "Failed" and len(status["attempts"]) == 1, status
    assert status["attempts"][0]["reason"] == "ConfigError"
    assert s3_server.bucket in status["attempts"][0]["message"]


def test_an_fsdp_job_of_two_workers_falls_back_from_a_sharded_checkpoint_in_the_bucket(
    operator: Operator, jobs: Jobs, namespace: str, s3_server: S3Server
) -> None:
    """fsdp + storage.s3 on the cluster: each worker's rank uploads its own shards under the
    step's prefix, rank 0 commits the manifest, and the bf16 attempt reshards nothing: it
    resumes its two ranks from the bucket."""
    secret(jobs.core, namespace, "ckpt-keys")
    spec = s3_spec(s3_server, namespace, steps=30, every=10)
    spec["workers"], spec["parallelism"] = 2, {"strategy": "fsdp"}
    spec["task"]["args"]["overflowAtStep"] = 15
    spec["resources"] = {"gpusPerWorker": 0}
    jobs.create("sharded", spec)
    status = jobs.wait_phase("sharded", ("Succeeded", "Failed"), 420)
    assert status["phase"] == "Succeeded", status
    first, second = status["attempts"]
    assert (first["precision"], first["reason"], first["worldSize"]) == ("fp16", "NumericFault", 2)
    assert (second["precision"], second["reason"], second["worldSize"]) == ("bf16", "Succeeded", 2)
    assert second["startStep"] == 10
    uid = jobs.get("sharded")["metadata"]["uid"]
    committed = manifests(s3_server, f"e2e-{namespace}/{namespace}/sharded/{uid}")
    final = next(m for key, m in committed.items() if key.endswith("step-000000030/manifest.json"))
    assert final["layout"] == "dcp" and {"__0_0.distcp", "__1_0.distcp", ".metadata"} <= set(final["files"])
