"""A session that ends leaves nothing running that the interpreter's exit would have to tear
down: no process group (also one a framework made for a world of one, as accelerate does
under the launcher's environment), none of its store or gloo threads, no non-daemon thread.
Such a group left at exit aborted a Hugging Face attempt after its report said Succeeded
(`terminate called without an active exception`, SIGABRT)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import free_port
from tests.unit.trainer.conftest import launch_env, spec

pytestmark = pytest.mark.unit

SCRIPT = """
import json, os, sys, threading
import torch
import torch.distributed as dist
from mpjob_trainer import session as mpjob

def os_threads():
    return sorted(open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task"))

with mpjob.start() as run:
    dist.init_process_group("gloo", rank=0, world_size=1)  # what accelerate does with RANK set
    during = os_threads()
    model = torch.nn.Linear(4, 1)
    start = run.resume(model=model)
    # A torch optimizer made while the group exists keeps it referenced inside torch (until
    # exit); without one the test sees the group's threads joined when the session ends.
    opt = torch.optim.SGD(model.parameters(), lr=0.1) if sys.argv[1] == "optimizer" else None
    for step in range(start, run.total_steps if opt is not None else start):
        with run.autocast():
            loss = model(torch.ones(2, 4)).pow(2).mean()
        run.backward(loss)
        run.step(opt)
        run.end_step(step + 1, loss=loss, samples=2)
print(json.dumps({
    "group": dist.is_initialized(),
    "during": during,
    "after": os_threads(),
    "nonDaemon": [t.name for t in threading.enumerate() if not t.daemon and t is not threading.main_thread()],
}))
"""


GROUP_THREADS = {"pt_tcpstore_uv", "gloo_tcp_loop", "pt_gloo_runloop"}


def session_end(tmp: Path, variant: str) -> dict[str, Any]:
    job = spec(task={"command": ["python", "train.py"]}, training={"steps": 3, "logEvery": 1})
    rank_env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}
    env = launch_env(tmp, job, "fp32", extra={**rank_env, "MASTER_PORT": str(free_port())})
    done = subprocess.run([sys.executable, "-c", SCRIPT, variant], env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "terminate called" not in done.stderr
    seen: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    assert GROUP_THREADS & set(seen["during"]), seen  # the group's threads were there
    return seen


@pytest.mark.process
def test_a_session_that_ends_destroys_a_process_group_a_framework_made(tmp_path: Path) -> None:
    seen = session_end(tmp_path, "optimizer")
    assert not seen["group"], seen
    assert seen["nonDaemon"] == [], seen


@pytest.mark.process
def test_the_groups_store_and_gloo_threads_are_joined_when_the_session_ends(tmp_path: Path) -> None:
    seen = session_end(tmp_path, "plain")
    assert not seen["group"], seen
    assert not GROUP_THREADS & set(seen["after"]), seen
