"""`mpjob run` gives the trainers spec.template.env as a cluster gives the trainer container:
its plain values reach the processes, the product's own variables win a name clash (a CPU job's
trainers see no GPU of the machine, as its pods see none of the node's), and an
entry read from the cluster (valueFrom) is named once at the start as unset here; `$(NAME)` in a
value and in task.command is expanded as the kubelet expands it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import mpjob_run_json

pytestmark = pytest.mark.unit

#: Writes the variables the test asks about, as its processes see them.
SCRIPT = """import json, os, sys
names = ["MY_SETTING", "EMPTY_ONE", "MASTER_ADDR", "FROM_SECRET", "SHELL_ONLY", "DERIVED", "CUDA_VISIBLE_DEVICES"]
open("seen.json", "w").write(json.dumps({**{n: os.environ.get(n) for n in names}, "argv": sys.argv[1:]}))
"""


@pytest.mark.process
def test_template_env_reaches_the_trainers_under_the_products_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "train.py").write_text(SCRIPT)
    monkeypatch.setenv("SHELL_ONLY", "from the shell")
    monkeypatch.setenv("MY_SETTING", "the shell's, overridden")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")  # a GPU machine's: a CPU job's trainers see none of them
    env = [
        {"name": "MY_SETTING", "value": "from the manifest"},
        {"name": "EMPTY_ONE"},
        {"name": "MASTER_ADDR", "value": "10.0.0.1"},  # the product's: the rendezvous stays on loopback
        {"name": "FROM_SECRET", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}},
        # Expanded as the kubelet expands it: an entry before it, a `$$`, one never defined.
        {"name": "DERIVED", "value": "$(MY_SETTING)/$(MASTER_ADDR) $$HOME $(SHELL_ONLY)"},
    ]
    doc = {
        "apiVersion": "mpjob.dev/v1alpha1",
        "kind": "MixedPrecisionJob",
        "metadata": {"name": "env"},
        "spec": {
            # The kubelet expands a command's `$(NAME)` with the container's variables only.
            "task": {"command": ["python", "train.py", "--out=$(MY_SETTING)", "$(SHELL_ONLY)", "$$5"]},
            "training": {"steps": 2},
            "resources": {"gpusPerWorker": 0},
            "template": {"env": env},
        },
    }
    events, report, _ = mpjob_run_json(tmp_path, doc)
    assert report["phase"] == "Succeeded", report
    assert json.loads((tmp_path / "seen.json").read_text()) == {
        "MY_SETTING": "from the manifest",
        "EMPTY_ONE": "",
        "MASTER_ADDR": "127.0.0.1",
        "FROM_SECRET": None,
        "SHELL_ONLY": "from the shell",
        "DERIVED": "from the manifest/127.0.0.1 $HOME $(SHELL_ONLY)",
        "CUDA_VISIBLE_DEVICES": "",
        "argv": ["--out=from the manifest", "$(SHELL_ONLY)", "$5"],
    }
    said = [e for e in events if e["event"] == "info" and "valueFrom" in e["message"]]
    assert len(said) == 1, events
    assert said[0]["field"] == "spec.template.env[3].valueFrom"
    message = said[0]["message"]
    assert "spec.template.env[3] (FROM_SECRET)" in message and "this shell's FROM_SECRET" in message
    assert events.index(said[0]) < next(i for i, e in enumerate(events) if e["event"] == "attemptStarted")
