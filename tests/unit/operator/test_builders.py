"""The attempt's Job and Service manifests."""

from __future__ import annotations

import json

import pytest

from mpjob.builders.attempt import attempt_job, attempt_service
from mpjob.builders.expansion import expanded, literal
from mpjob.planning.planner import StartAttempt
from mpjob_contract.api import MixedPrecisionJobSpec
from mpjob_contract.launch import CHECKPOINT_MOUNT, AttemptLaunch
from mpjob_contract.pod_labels import OPERATOR_POD_LABELS, replaced_labels

pytestmark = pytest.mark.unit


#: The job's own checkpoint folder: `<mount>/<namespace>/<name>/<uid>`.
FOLDER = f"{CHECKPOINT_MOUNT}/ml/gpt/u-1"


def build(resume_from: str = f"{FOLDER}/step-000000200", **over: object) -> dict:
    spec = MixedPrecisionJobSpec.model_validate({"task": {"builtin": "gpt"}, **over})
    start = StartAttempt(index=2, precision="bf16", resume_from=resume_from, start_step=200)
    return attempt_job(job="gpt", namespace="ml", uid="u-1", spec=spec, start=start, image="mpjob-trainer:0.1.0")


def _env(job: dict) -> dict:
    return {e["name"]: e for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}


def test_indexed_job_with_one_pod_per_worker_and_no_retries() -> None:
    job = build(workers=4)
    assert job["metadata"]["name"] == "gpt-a2"
    assert (
        job["spec"]["completionMode"],
        job["spec"]["completions"],
        job["spec"]["parallelism"],
        job["spec"]["backoffLimit"],
    ) == ("Indexed", 4, 4, 0)
    pod = job["spec"]["template"]["spec"]
    assert pod["subdomain"] == "gpt-a2" and pod["restartPolicy"] == "Never"
    env = _env(job)
    assert env["MASTER_ADDR"]["value"] == "gpt-a2-0.gpt-a2.ml.svc"
    assert "job-completion-index" in env["JOB_COMPLETION_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"]
    # The launcher gives each process its rank; the pod says how many processes and pods there are.
    assert "RANK" not in env and "WORLD_SIZE" not in env
    command = pod["containers"][0]["command"]
    assert command == ["mpjob-launch", "--nproc-per-worker", "1", "--workers", "4", "--", "mpjob-trainer"]
    launch = AttemptLaunch.model_validate_json(env["MPJOB_LAUNCH"]["value"])
    assert (launch.attempt, launch.precision, launch.resume_from) == (2, "bf16", f"{FOLDER}/step-000000200")


def test_checkpoints_go_to_the_jobs_own_folder_and_resume_only_from_there() -> None:
    launch = AttemptLaunch.model_validate_json(_env(build())["MPJOB_LAUNCH"]["value"])
    assert (launch.checkpoint_dir, launch.job_uid, launch.job_identity) == (FOLDER, "u-1", "ml/gpt/u-1")
    mount = build()["spec"]["template"]["spec"]["containers"][0]["volumeMounts"][0]
    assert (mount["name"], mount["mountPath"]) == ("checkpoints", CHECKPOINT_MOUNT)  # the folder lies below it
    for elsewhere in (
        f"{CHECKPOINT_MOUNT}/step-000000200",  # the volume's root
        f"{CHECKPOINT_MOUNT}/ml/other/u-2/step-000000200",  # another job's folder
        f"{CHECKPOINT_MOUNT}/ml/gpt/u-0/step-000000200",  # an earlier job of the same name
        f"{FOLDER}/../u-0/step-000000200",
    ):
        launch = AttemptLaunch.model_validate_json(_env(build(resume_from=elsewhere))["MPJOB_LAUNCH"]["value"])
        assert launch.resume_from is None, elsewhere  # the trainer resumes from its own newest instead


def test_trainer_pods_are_locked_down() -> None:
    pod = build()["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert pod["automountServiceAccountToken"] is False
    sc = container["securityContext"]
    assert sc["runAsNonRoot"] and not sc["allowPrivilegeEscalation"] and sc["capabilities"]["drop"] == ["ALL"]
    assert container["terminationMessagePath"] == "/dev/termination-log"


def test_gpu_jobs_request_gpus_tolerate_the_taint_and_need_the_capability() -> None:
    pod = build(resources={"gpusPerWorker": 2, "minComputeCapability": "8.6"})["spec"]["template"]["spec"]
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms[0]["matchExpressions"] == [{"key": "nvidia.com/gpu.compute.major", "operator": "Gt", "values": ["8"]}]
    assert {"key": "nvidia.com/gpu.compute.minor", "operator": "Gt", "values": ["5"]} in terms[1]["matchExpressions"]


def test_cpu_jobs_have_no_gpu_bits() -> None:
    pod = build(resources={"gpusPerWorker": 0})["spec"]["template"]["spec"]
    assert "tolerations" not in pod and "affinity" not in pod
    assert "nvidia.com/gpu" not in json.dumps(pod["containers"][0].get("resources", {}))


def test_cpu_jobs_are_kept_from_the_nodes_gpus() -> None:
    """A pod that asks for no GPU still gets every GPU of a node whose runtime is NVIDIA's by
    default (the CUDA image names them all): a CPU job's pods name none, whatever the template
    says; a GPU job's leave the device plugin's choice alone."""
    all_gpus = {"env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}
    pod = build(resources={"gpusPerWorker": 0}, template=all_gpus)["spec"]["template"]["spec"]
    listed = pod["containers"][0]["env"]
    cpu = {e["name"]: e for e in listed}
    assert cpu["NVIDIA_VISIBLE_DEVICES"]["value"] == "void" and cpu["CUDA_VISIBLE_DEVICES"]["value"] == ""
    assert [e["name"] for e in listed].count("NVIDIA_VISIBLE_DEVICES") == 1
    gpu = _env(build(resources={"gpusPerWorker": 2}))
    assert "NVIDIA_VISIBLE_DEVICES" not in gpu and "CUDA_VISIBLE_DEVICES" not in gpu


def _shm(pod: dict) -> tuple[list[dict], list[dict]]:
    mounts = [m for m in pod["containers"][0]["volumeMounts"] if m["mountPath"] == "/dev/shm"]
    return mounts, [v for v in pod["volumes"] if any(v["name"] == m["name"] for m in mounts)]


def test_gpu_pods_get_a_memory_backed_dev_shm_and_cpu_pods_do_not() -> None:
    mounts, volumes = _shm(build(resources={"gpusPerWorker": 8})["spec"]["template"]["spec"])
    assert len(mounts) == 1 and volumes == [{"name": mounts[0]["name"], "emptyDir": {"medium": "Memory"}}]
    assert _shm(build(resources={"gpusPerWorker": 0})["spec"]["template"]["spec"]) == ([], [])


@pytest.mark.parametrize(
    "template",
    [
        {
            "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}}],
            "volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}],
        },
        {
            "volumes": [{"name": "dshm", "hostPath": {"path": "/data"}}],
            "volumeMounts": [{"name": "dshm", "mountPath": "/x"}],
        },
    ],
)
def test_a_templates_own_dev_shm_or_volume_name_wins(template: dict) -> None:
    pod = build(resources={"gpusPerWorker": 1}, template=template)["spec"]["template"]["spec"]
    assert [v for v in pod["volumes"] if v["name"] != "checkpoints"] == template["volumes"]
    assert [m for m in pod["containers"][0]["volumeMounts"] if m["name"] != "checkpoints"] == template["volumeMounts"]


def test_template_is_merged_without_replacing_the_trainer() -> None:
    job = build(
        template={
            "nodeSelector": {"pool": "a100"},
            "env": [{"name": "EXTRA", "value": "1"}, {"name": "MASTER_PORT", "value": "99"}],
            "tolerations": [{"key": "spot", "operator": "Exists"}],
        }
    )
    pod = job["spec"]["template"]["spec"]
    env = _env(job)
    assert env["EXTRA"]["value"] == "1" and env["MASTER_PORT"]["value"] == "29500"  # ours win
    assert pod["nodeSelector"] == {"pool": "a100"} and {"key": "spot", "operator": "Exists"} in pod["tolerations"]
    assert pod["containers"][0]["command"][-2:] == ["--", "mpjob-trainer"]


def test_own_command_runs_under_the_launcher_in_its_working_dir() -> None:
    job = build(
        workers=2,
        task={"command": ["python", "train.py", "--lr", "3e-4"], "workingDir": "/app"},
        resources={"gpusPerWorker": 8},
    )
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["command"] == [
        "mpjob-launch",
        "--nproc-per-worker",
        "8",
        "--workers",
        "2",
        "--",
        "python",
        "train.py",
        "--lr",
        "3e-4",
    ]
    assert container["workingDir"] == "/app"


@pytest.mark.parametrize(
    ("resources", "expected"),
    [({"gpusPerWorker": 0}, "1"), ({"gpusPerWorker": 4}, "4"), ({"gpusPerWorker": 0, "processesPerWorker": 3}, "3")],
)
def test_processes_per_worker_defaults_to_one_per_gpu(resources: dict, expected: str) -> None:
    command = build(resources=resources)["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[command.index("--nproc-per-worker") + 1] == expected
    assert "workingDir" not in build(resources=resources)["spec"]["template"]["spec"]["containers"][0]


def test_queue_name_labels_the_job_and_creates_it_suspended() -> None:
    job = build(runPolicy={"queueName": "team-a"})
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a" and job["spec"]["suspend"] is True


def test_the_template_labels_the_operator_names_as_replaced_are_the_ones_it_replaces() -> None:
    template = {"labels": {key: "mine" for key in OPERATOR_POD_LABELS} | {"team": "vision"}}
    pod_labels = build(template=template)["spec"]["template"]["metadata"]["labels"]
    assert {key for key, value in pod_labels.items() if value == "mine"} == set()
    assert pod_labels["team"] == "vision" and set(OPERATOR_POD_LABELS) < set(pod_labels)
    assert replaced_labels(template["labels"]) == list(OPERATOR_POD_LABELS)


def test_checkpoint_volume_is_the_users_claim() -> None:
    pod = build(checkpoint={"volume": {"persistentVolumeClaim": {"claimName": "ckpt"}}})["spec"]["template"]["spec"]
    assert pod["volumes"][0] == {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "ckpt"}}


def test_headless_service_selects_the_attempt() -> None:
    svc = attempt_service("gpt", "ml", 2, "bf16")
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
    assert svc["spec"]["selector"] == {"mpjob.dev/job": "gpt", "mpjob.dev/attempt": "2"}


def test_parallelism_reaches_the_trainer_in_the_attempts_launch() -> None:
    parallelism = {"strategy": "fsdp", "activationCheckpointing": "selective", "fsdp": {"reshardAfterForward": False}}
    launch = AttemptLaunch.model_validate_json(_env(build(parallelism=parallelism))["MPJOB_LAUNCH"]["value"])
    assert launch.spec.parallelism.strategy == "fsdp"
    assert launch.spec.parallelism.activation_checkpointing == "selective"
    assert launch.spec.parallelism.fsdp.reshard_after_forward is False
    assert AttemptLaunch.model_validate_json(_env(build())["MPJOB_LAUNCH"]["value"]).spec.parallelism.strategy == "ddp"


def test_the_kubelet_hands_the_launch_over_as_written_whatever_dollars_the_spec_holds() -> None:
    """The kubelet expands `$(NAME)` in env values (`$$` is a `$`), with a Service's variables
    defined: the launch carries the user's spec, so its value is escaped to arrive as written;
    the manifest's own env entries are left for the kubelet to expand, as the user wrote them."""
    args = {"pattern": "^a$$b$", "host": "$(KUBERNETES_SERVICE_HOST)", "open": "$(unclosed"}
    env = [{"name": "OUT", "value": "/data/$(POD_NAME)"}]
    job = build(task={"module": "my_pkg.train:make_task", "args": args}, template={"env": env})
    kubelet = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "POD_NAME": "gpt-a2-0"}
    handed = expanded(_env(job)["MPJOB_LAUNCH"]["value"], kubelet)
    assert AttemptLaunch.model_validate_json(handed).spec.task.args == args
    assert _env(job)["OUT"] == {"name": "OUT", "value": "/data/$(POD_NAME)"}


@pytest.mark.parametrize(
    ("text", "defined", "handed"),
    [
        ("a$$b", {}, "a$b"),
        ("$(X)/y", {"X": "1"}, "1/y"),
        ("$(Y)", {}, "$(Y)"),  # not defined: left as written
        ("$$(X)", {"X": "1"}, "$(X)"),  # escaped
        ("$x $(", {}, "$x $("),
    ],
)
def test_expansion_follows_the_kubelets_rules(text: str, defined: dict[str, str], handed: str) -> None:
    assert expanded(text, defined) == handed
    assert expanded(literal(text), defined) == text
