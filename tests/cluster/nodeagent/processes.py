"""The container runtime: a container is its command run as a local process group (the
agent runs no images), with the pod's paths rewritten to local directories.

Each container runs under `/bin/sh -c 'trap true TERM INT; "$@"; echo $? > "$0"'` in its own
session: the shell outlives a SIGTERM to the group long enough to write the command's exit
code to the container's exit file, so the code survives an agent restart (a re-adopted
process is not our child and cannot be waited for). No exit file means SIGKILL: 137.

Paths the container names (volume mounts, its termination message path) are rewritten in
env values, args and workingDir to the directories behind them, longest path first; its
termination message is rewritten back, so the pod's status names the paths the container
was given, as a kubelet's would.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.cluster.layout import pid_alive
from tests.cluster.nodeagent.environment import container_env
from tests.cluster.nodeagent.network import own_rendezvous
from tests.cluster.nodeagent.state import PodProcess

WRAPPER = 'trap true TERM INT; "$@"; echo $? > "$0"'
KILLED = 137  # 128 + SIGKILL: what a runtime reports for a container that left no exit code
SIGKILL_WAIT = 5.0


@dataclass(frozen=True)
class PodSandbox:
    """What the containers of one pod share: its IP, its directory, volumes and credentials."""

    pod: Any
    ip: str
    pod_dir: Path
    volumes: dict[str, Path]
    kubeconfig: str | None
    hosts: list[str]


@dataclass(frozen=True)
class Started:
    """A container's process and the files it reports through."""

    pid: int
    argv: list[str]
    exit_file: Path
    term_file: Path
    log_file: Path
    #: Local directory -> the volume mount path the container saw (to read its messages back).
    mounts: dict[str, str]


class PathRewrites:
    """Container paths -> local paths, applied to a string longest container path first."""

    def __init__(self, mapping: dict[str, Path]) -> None:
        self._pairs = sorted(mapping.items(), key=lambda kv: -len(kv[0]))

    def __call__(self, value: str) -> str:
        for src, dst in self._pairs:
            if src and src in value:
                value = value.replace(src, str(dst))
        return value

    def mounts(self) -> dict[str, str]:
        """Local directory -> container path, for every volume mount (not the message file)."""
        return {str(dst): src for src, dst in self._pairs if src and dst.is_dir()}


class ProcessRuntime:
    """Starts containers, tells when they exited, and stops them (SIGTERM, grace, SIGKILL)."""

    def __init__(self, core: Any, logs_dir: Path) -> None:
        self.core = core
        self.logs_dir = logs_dir
        self.procs: dict[int, subprocess.Popen[bytes]] = {}  # pid -> Popen for our own children
        #: Containers this runtime reaped: their numbers may be another process's (and process
        #: group's) by now (pid_max is 32768 here and the suite wraps it), so never signal them.
        self.reaped: set[int] = set()

    def run_init(self, sandbox: PodSandbox, ctr: Any) -> None:
        """Run an init container to its end; raise unless it exited 0."""
        proc, started = self._launch(sandbox, ctr)
        code = proc.wait()
        if code != 0 or exit_code(started.exit_file) != 0:
            raise RuntimeError(f"init container {ctr.name} exited {exit_code(started.exit_file)}")

    def start(self, sandbox: PodSandbox, ctr: Any) -> Started:
        """Start the pod's main container and keep its process to poll."""
        proc, started = self._launch(sandbox, ctr)
        self.procs[proc.pid] = proc
        self.reaped.discard(proc.pid)
        return started

    def _launch(self, sandbox: PodSandbox, ctr: Any) -> tuple[subprocess.Popen[bytes], Started]:
        term_file = sandbox.pod_dir / f"termination-{ctr.name}"
        term_file.write_text("")
        rewrite = _rewrites(sandbox, ctr, term_file)
        env = self.environment(sandbox, ctr, term_file=term_file, rewrite=rewrite)
        argv = [rewrite(a) for a in (ctr.command or []) + (ctr.args or [])]
        if not argv:
            raise RuntimeError(f"container {ctr.name} has no command: the test node agent runs no images")
        workdir = working_dir(ctr, sandbox.pod_dir, rewrite)
        workdir.mkdir(parents=True, exist_ok=True)
        meta = sandbox.pod.metadata
        log_file = self.logs_dir / f"{meta.namespace}_{meta.name}_{ctr.name}.log"
        exit_file = sandbox.pod_dir / f"exit-{ctr.name}"
        exit_file.unlink(missing_ok=True)
        with log_file.open("ab") as out:
            proc = subprocess.Popen(
                ["/bin/sh", "-c", WRAPPER, str(exit_file), *argv],
                env=env,
                cwd=workdir,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        started = Started(
            proc.pid, argv, exit_file=exit_file, term_file=term_file, log_file=log_file, mounts=rewrite.mounts()
        )
        return proc, started

    def environment(self, sandbox: PodSandbox, ctr: Any, *, term_file: Path, rewrite: PathRewrites) -> dict[str, str]:
        """The agent's environment without its cluster's settings, the pod's names, then the
        container's envFrom and env; raises ContainerConfigError (environment.py)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBE", "MPJOB_CLUSTER"))}
        env.pop("VIRTUAL_ENV_PROMPT", None)
        env.update(
            {
                "HOSTNAME": sandbox.pod.spec.hostname or sandbox.pod.metadata.name,
                "POD_IP": sandbox.ip,
                "MPJOB_TERMINATION_LOG": str(term_file),
                "HOME": str(sandbox.pod_dir),
            }
        )
        env.update(container_env(self.core, sandbox.pod, ctr, ip=sandbox.ip, rewrite=rewrite))
        own_rendezvous(sandbox.pod, env)
        if sandbox.kubeconfig:
            env["KUBECONFIG"] = sandbox.kubeconfig
        return env

    def exited(self, rec: PodProcess) -> int | None:
        """The container's exit code once its process is gone (137 if it left none), else None."""
        proc = self.procs.get(rec.pid)
        if proc is not None:
            if proc.poll() is None:
                return None
            self.procs.pop(rec.pid, None)
            self.reaped.add(rec.pid)
        elif rec.pid not in self.reaped and pid_alive(rec.pid):
            return None
        code = exit_code(rec.exit_file)
        return KILLED if code is None else code

    def kill(self, rec: PodProcess, grace: float) -> int:
        """SIGTERM the container's process group, SIGKILL it after `grace` seconds; its exit code.
        A container that has exited is not signalled: its group may be another's by now."""
        code = self.exited(rec)
        if code is not None:
            return code
        _signal_group(rec.pid, signal.SIGTERM)
        code = self._wait_exit(rec, grace)
        if code is not None:
            return code
        _signal_group(rec.pid, signal.SIGKILL)
        code = self._wait_exit(rec, SIGKILL_WAIT)
        return KILLED if code is None else code

    def _wait_exit(self, rec: PodProcess, seconds: float) -> int | None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            code = self.exited(rec)
            if code is not None:
                return code
            time.sleep(0.1)
        return None


def _signal_group(pid: int, signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signum)


def _rewrites(sandbox: PodSandbox, ctr: Any, term_file: Path) -> PathRewrites:
    mounts = {
        m.mount_path: sandbox.volumes[m.name] / (m.sub_path or "")
        for m in (ctr.volume_mounts or [])
        if m.name in sandbox.volumes
    }
    term_path = ctr.termination_message_path or "/dev/termination-log"
    return PathRewrites({**mounts, term_path: term_file})


def working_dir(ctr: Any, pod_dir: Path, rewrite: PathRewrites) -> Path:
    """workingDir inside a volume is that volume's directory; any other path lies under the pod's."""
    if not ctr.working_dir:
        return pod_dir
    workdir = Path(rewrite(ctr.working_dir))
    if not workdir.is_absolute():
        workdir = pod_dir / workdir
    if str(workdir) == ctr.working_dir:
        workdir = pod_dir / ctr.working_dir.lstrip("/")
    return workdir


def exit_code(exit_file: Path | str) -> int | None:
    """The code the wrapper wrote, or None if it wrote none (yet)."""
    try:
        return int(Path(exit_file).read_text().strip())
    except (OSError, ValueError):
        return None


def termination_message(rec: PodProcess, code: int) -> str:
    """What the container wrote to its termination log, with the volume paths the container saw;
    on failure without one, its log's tail."""
    try:
        text = Path(rec.term_file).read_bytes()[:4096].decode(errors="replace")
    except OSError:
        text = ""
    for local, mount in sorted(rec.mounts.items(), key=lambda kv: -len(kv[0])):
        text = text.replace(local, mount)
    if not text and code != 0:
        try:  # FallbackToLogsOnError-style: the tail of the log
            tail = Path(rec.log_file).read_bytes()[-2048:].decode(errors="replace")
            text = "\n".join(tail.splitlines()[-20:])
        except OSError:
            pass
    return text
