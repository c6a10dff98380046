"""The container images, read from their Dockerfiles and uv.lock: pinned bases, non-root
numeric users, installs from the lock, the operator image without torch, the trainer image
without kopf/kubernetes, and entrypoints/ports that match what the chart and operator use."""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from mpjob.builders.attempt import RENDEZVOUS_PORT, attempt_job
from mpjob.controller.config import DEFAULT_TRAINER_IMAGE
from mpjob.planning.planner import first_attempt
from mpjob_contract.api import MixedPrecisionJobSpec
from mpjob_contract.metrics import DEFAULT_METRICS_PORT

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
OPERATOR = REPO / "Dockerfile"
TRAINER = REPO / "trainer-image/Dockerfile"


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [value for kw, value in self.instructions if kw == keyword]


def parse(path: Path) -> list[Stage]:
    """Stages of a Dockerfile: continuation lines joined, comments dropped, ARG defaults applied
    to FROM lines."""
    text = re.sub(
        r"\\\n", " ", "\n".join(line for line in path.read_text().splitlines() if not line.lstrip().startswith("#"))
    )
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        keyword, _, value = line.strip().partition(" ")
        keyword, value = keyword.upper(), value.strip()
        if keyword == "ARG" and not stages:
            name, _, default = value.partition("=")
            args[name] = default
        elif keyword == "FROM":
            base = re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), value.split()[0])
            alias = value.split()[2] if len(value.split()) >= 3 and value.split()[1].upper() == "AS" else None
            stages.append(Stage(base, alias))
        else:
            assert stages, f"{path.name}: {keyword} before FROM"
            stages[-1].instructions.append((keyword, value))
    return stages


def run_commands(stage: Stage) -> str:
    return " ; ".join(stage.all("RUN"))


def lock_closure(package: str) -> set[str]:
    """Every package `package` pulls in from uv.lock (any platform marker)."""
    lock = tomllib.loads((REPO / "uv.lock").read_text())
    deps = {p["name"]: [d["name"] for d in p.get("dependencies", [])] for p in lock["package"]}
    seen: set[str] = set()
    todo = [package]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(deps.get(name, []))
    return seen


def images() -> list[Path]:
    return [p for p in (OPERATOR, TRAINER) if p.exists()]


@pytest.mark.parametrize("path", images(), ids=lambda p: str(p.relative_to(REPO)))
def test_base_images_are_pinned_to_exact_versions(path: Path) -> None:
    stages = parse(path)
    names = {s.name for s in stages if s.name}
    for stage in stages:
        if stage.base in names:
            continue  # FROM an earlier stage
        image, _, digest = stage.base.partition("@")
        assert "$" not in image, f"unresolved ARG in FROM {stage.base}"
        repo, _, tag = image.rpartition(":")
        assert repo and tag and tag != "latest", f"{stage.base}: no tag"
        assert re.search(r"\d+\.\d+\.\d+", tag) or digest.startswith("sha256:"), f"{stage.base}: not an exact version"


@pytest.mark.parametrize("path", images(), ids=lambda p: str(p.relative_to(REPO)))
def test_final_stage_runs_as_a_numeric_non_root_user(path: Path) -> None:
    final = parse(path)[-1]
    users = final.all("USER")
    assert users, "the final stage sets no USER"
    user = users[-1]
    assert re.fullmatch(r"\d+(:\d+)?", user), f"USER {user}: numeric, so runAsNonRoot can verify it"
    assert all(int(x) > 0 for x in user.split(":"))


@pytest.mark.parametrize("path", images(), ids=lambda p: str(p.relative_to(REPO)))
def test_python_packages_come_from_the_lock_with_a_pinned_uv(path: Path) -> None:
    stages = parse(path)
    runs = " ; ".join(run_commands(s) for s in stages)
    assert re.search(r"uv sync\b[^;&]*--locked", runs), "install with `uv sync --locked`"
    assert "--no-dev" in runs
    uv = re.search(r"uv==(\d+\.\d+\.\d+)", runs)
    make_uv = re.search(r"UV_VERSION := (\S+)", (REPO / "Makefile").read_text())
    assert uv and make_uv and uv.group(1) == make_uv.group(1), "the image's uv is the one `make setup` installs"
    copies = " ".join(c for s in stages for c in s.all("COPY"))
    assert "uv.lock" in copies
    for command in re.split(r"&&|;", runs):
        if "pip install" in command:
            wanted = [w for w in command.split("pip install", 1)[1].split() if not w.startswith("-")]
            assert wanted == [uv.group(0)], f"pip installs only uv; everything else comes from the lock: {command}"


def test_operator_image_installs_the_operator_package_and_never_torch() -> None:
    stages = parse(OPERATOR)
    runs = run_commands(stages[0])
    assert "--package mpjob " in runs + " " and "--package mpjob-trainer" not in runs
    closure = lock_closure("mpjob")
    assert {"kopf", "kubernetes", "mpjob-contract"} <= closure
    assert not {n for n in closure if n in ("torch", "torchao") or n.startswith(("nvidia-", "triton"))}
    assert re.search(r"! \S*python -c \"import torch\"", runs), "the build proves torch is absent"
    # `mpjob run`'s progress view and plot are the `local` extra, which the image leaves out.
    assert not {"rich", "matplotlib"} & closure and "--extra" not in runs and "--all-extras" not in runs
    lock = tomllib.loads((REPO / "uv.lock").read_text())
    (mpjob,) = [p for p in lock["package"] if p["name"] == "mpjob"]
    assert {d["name"] for d in mpjob["optional-dependencies"]["local"]} == {"rich", "matplotlib"}


def test_trainer_package_needs_only_torch_prometheus_pydantic_and_the_contract() -> None:
    """It installs into a user's own image on its own (pip install), pulling nothing else."""
    lock = tomllib.loads((REPO / "uv.lock").read_text())
    (trainer,) = [p for p in lock["package"] if p["name"] == "mpjob-trainer"]
    assert {d["name"] for d in trainer["dependencies"]} == {"torch", "prometheus-client", "pydantic", "mpjob-contract"}


def test_trainer_image_installs_no_kubernetes_client() -> None:
    if not TRAINER.exists():
        pytest.skip("trainer-image/Dockerfile not written yet")
    runs = run_commands(parse(TRAINER)[0])
    assert "--package mpjob-trainer" in runs
    closure = lock_closure("mpjob-trainer")
    assert "torch" in closure and not {"kopf", "kubernetes"} & closure
    for module in ("kopf", "kubernetes"):
        assert f'import {module}"' in runs, f"the build proves {module} is absent"
    # fp8 attempts need torchao (the fp8 extra, pinned exactly): installed, and the build imports it.
    assert "--extra fp8" in runs and 'python -c "import torchao.float8"' in runs
    lock = tomllib.loads((REPO / "uv.lock").read_text())
    (trainer,) = [p for p in lock["package"] if p["name"] == "mpjob-trainer"]
    assert [d["name"] for d in trainer["optional-dependencies"]["fp8"]] == ["torchao"]
    (pin,) = [d for d in trainer["metadata"]["requires-dist"] if d["name"] == "torchao"]
    assert pin["specifier"].startswith("==") and pin["marker"] == "extra == 'fp8'"


def _entrypoint(path: Path) -> list[str]:
    (entrypoint,) = parse(path)[-1].all("ENTRYPOINT")[-1:]
    assert entrypoint.startswith("["), "exec form: signals reach the process"
    return json.loads(entrypoint)


def _scripts(pyproject: Path) -> dict[str, str]:
    return tomllib.loads(pyproject.read_text())["project"]["scripts"]


def test_operator_entrypoint_is_the_command_the_chart_runs() -> None:
    assert _entrypoint(OPERATOR) == ["mpjob", "operator"]
    assert "mpjob" in _scripts(REPO / "operator/pyproject.toml")
    values = yaml.safe_load((REPO / "helm/mpjob/values.yaml").read_text())
    exposed = {int(p) for e in parse(OPERATOR)[-1].all("EXPOSE") for p in shlex.split(e)}
    assert exposed == {values["operator"]["metricsPort"], values["operator"]["healthPort"]}
    uid = int(parse(OPERATOR)[-1].all("USER")[-1].split(":")[0])
    assert values["podSecurityContext"]["runAsUser"] == uid


def test_trainer_entrypoint_user_and_ports_match_the_attempt_pods() -> None:
    if not TRAINER.exists():
        pytest.skip("trainer-image/Dockerfile not written yet")
    # Every pod runs the launcher; by itself the image trains the builtin task in one process.
    assert _entrypoint(TRAINER) == ["mpjob-launch"]
    (cmd,) = parse(TRAINER)[-1].all("CMD")[-1:]
    assert json.loads(cmd) == ["--", "mpjob-trainer"]
    assert {"mpjob-trainer", "mpjob-launch"} <= set(_scripts(REPO / "trainer-image/pyproject.toml"))
    spec = MixedPrecisionJobSpec.model_validate({"task": {"builtin": "mlp"}})
    start = first_attempt(spec)
    pod = attempt_job(job="j", namespace="ns", uid="u", spec=spec, start=start, image="mpjob-trainer:0.1.0")
    pod = pod["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"][:1] == _entrypoint(TRAINER) and container["command"][-2:] == json.loads(cmd)
    # Checkpoints written by the image's user are readable by the next attempt's pod.
    uid, gid = (int(x) for x in parse(TRAINER)[-1].all("USER")[-1].split(":"))
    assert (container["securityContext"]["runAsUser"], container["securityContext"]["runAsGroup"]) == (uid, gid)
    exposed = {int(p) for e in parse(TRAINER)[-1].all("EXPOSE") for p in shlex.split(e)}
    assert exposed == {DEFAULT_METRICS_PORT, RENDEZVOUS_PORT}


def test_trainer_image_can_compile_as_its_user() -> None:
    """training.compile is on by default on CUDA: Triton builds its launchers at run time with a C
    compiler against Python.h, and keeps its caches under a HOME the image's user may write."""
    final = parse(TRAINER)[-1]
    runs = run_commands(final)
    for package in ("gcc", "libc6-dev", "python3-dev"):
        assert re.search(rf"apt-get install [^&]*\b{re.escape(package)}\b", runs), package
    env = " ".join(final.all("ENV"))
    home = re.search(r"\bHOME=(\S+)", env)
    assert home, "HOME is set (UID 1000 has no passwd entry: HOME would be /)"
    uid = final.all("USER")[-1]
    assert f"chown {uid} {home.group(1)}" in runs
    for cache in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR"):
        assert re.search(rf"\b{cache}={re.escape(home.group(1))}/", env), cache


@pytest.mark.parametrize("path", sorted(REPO.glob("examples/*/Dockerfile")), ids=lambda p: str(p.relative_to(REPO)))
def test_an_examples_image_builds_on_the_trainer_image_its_builder_names(path: Path) -> None:
    """The walkthrough builds the trainer image under the user's registry: an example's image,
    built on a bare `mpjob-trainer` name, found no such image. Its base is an ARG whose default
    is the operator's default trainer image, and its build line says how to name another."""
    (stage,) = parse(path)
    assert stage.base == DEFAULT_TRAINER_IMAGE
    assert re.search(r"^FROM \$\{TRAINER_IMAGE\}$", path.read_text(), re.MULTILINE), "the base is not the ARG"
    assert "--build-arg TRAINER_IMAGE=" in path.read_text()
