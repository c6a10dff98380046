"""docs/tutorial.md runs as written: its local shell blocks (```bash tutorial```) run in order,
each in its own bash in a temporary folder holding a copy of examples/tutorial, with this
environment's `mpjob` and `python` first on PATH; each must exit 0, and the runs must leave
what the tutorial says they leave. Blocks marked `s3` need the versitygw binary that
tests/cluster/build-s3.sh caches: without it (or with the tutorial's port taken) they are
skipped. The cluster part and `make demo` are `console` blocks the test does not run."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests import warm
from tests.helpers import build_cache

pytestmark = [pytest.mark.unit, pytest.mark.process]

REPO = Path(__file__).resolve().parents[2]
TUTORIAL = REPO / "docs" / "tutorial.md"
S3_BUILD = REPO / "tests" / "cluster" / "s3-build"
#: The S3 server's port in the tutorial's commands and in examples/tutorial/tutorial-s3.yaml.
S3_PORT = 9300
BLOCK_TIMEOUT = 300


@dataclass(frozen=True)
class Block:
    line: int
    tags: frozenset[str]
    script: str
    shown: str  # the plain ``` block right after it: the output the tutorial shows


def tutorial_blocks(text: str) -> list[Block]:
    """The ```bash tutorial ...``` blocks of the text, in order, with the tags after `tutorial`."""
    blocks = []
    pattern = r"^```bash tutorial([^\n]*)\n(.*?)^```\n(?:\n```\n(.*?)^```$)?"
    for match in re.finditer(pattern, text, re.MULTILINE | re.DOTALL):
        line = text.count("\n", 0, match.start()) + 1
        blocks.append(Block(line, frozenset(match.group(1).split()), match.group(2), match.group(3) or ""))
    return blocks


#: What differs from machine to machine in a run's lines: throughput, recovery time, a hash.
MACHINE = [
    (re.compile(r" (?:[\d.]+|-) samples/s$"), ""),
    (re.compile(r"back in [\d.]+ s"), "back in _ s"),
    (re.compile(r"sha256 [0-9a-f]{16}"), "sha256 _"),
]
FIGURE = re.compile(r"(?<=loss |grad )(\d+\.\d+)")


def same_story(shown: str, printed: str) -> bool:
    """The lines the tutorial shows are the lines the run printed, save what the machine decides
    (above) and a loss or a gradient norm rounded otherwise (`_rounding`): another CPU's kernels
    round so (an AMD EPYC's fp16 and bf16 losses differ from an Intel Xeon's by 2 or 3 in the
    fourth decimal)."""

    def lines(text: str) -> list[str]:
        out = []
        for line in text.strip().splitlines():
            for pattern, repl in MACHINE:
                line = pattern.sub(repl, line)
            out.append(line)
        return out

    shown_lines, printed_lines = lines(shown), lines(printed)
    if len(shown_lines) != len(printed_lines):
        return False
    for a, b in zip(shown_lines, printed_lines, strict=True):
        if FIGURE.sub("_", a) != FIGURE.sub("_", b):
            return False
        pairs = zip(FIGURE.findall(a), FIGURE.findall(b), strict=True)
        precision = next((p for p in EPSILON if f" {p} " in a), "")
        if any(abs(float(x) - float(y)) > _rounding(x, precision) for x, y in pairs):
            return False
    return True


#: The spacing of numbers near 1 in the half precisions (their machine epsilon).
EPSILON = {"fp16": 2.0**-10, "bf16": 2.0**-7}


def _rounding(figure: str, precision: str) -> float:
    """How far another CPU may print `figure` from a line trained in `precision`: 1.5 in its last
    digit, and in fp16 or bf16 one step of that precision (its epsilon, relative)."""
    digit = 1.5 * 10.0 ** -len(figure.split(".")[1])
    return max(digit, abs(float(figure)) * EPSILON.get(precision, 0.0))


def shows_its_run(block: Block) -> bool:
    """Whether the block's shown output is its run's (a kill lands where the machine's speed puts
    it, so the killed run's blocks show one of its runs; the S3 keys' digest is the folder's)."""
    return bool(block.shown) and "runs/killed" not in block.script and "find mpjob" not in block.script


def versitygw_cached() -> bool:
    """Whether tests/cluster/build-s3.sh would answer from its cache (the same key it computes)."""
    script = REPO / "tests" / "cluster" / "build-s3.sh"
    version = re.search(r"github\.com/versity/versitygw (v\S+)", (S3_BUILD / "go.mod").read_text())
    if version is None:
        return False
    digest = hashlib.sha256(
        (S3_BUILD / "go.mod").read_bytes() + (S3_BUILD / "go.sum").read_bytes() + script.read_bytes()
    ).hexdigest()[:12]
    return (build_cache() / "cluster" / f"versitygw-{version.group(1)}-{digest}" / "bin" / "versitygw").exists()


def port_free(port: int) -> bool:
    """Nothing answers on the port (a connection in TIME_WAIT from an earlier run does not count)."""
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) != 0


def report(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "report.json").read_text())


def test_the_tutorial_has_local_blocks_and_tags_the_s3_ones() -> None:
    blocks = tutorial_blocks(TUTORIAL.read_text())
    assert len(blocks) >= 6
    assert all(b.tags <= {"s3"} for b in blocks)
    assert any("tutorial-s3.yaml" in b.script and "s3" in b.tags for b in blocks)
    assert not any("kubectl" in b.script or "make demo" in b.script for b in blocks)  # not run here
    assert sum(shows_its_run(b) for b in blocks) >= 5  # outputs checked against the run


def test_same_story_leaves_the_machine_out_and_nothing_else() -> None:
    shown = "step 40/80 fp16 a0 loss 0.5507 scale 32768 grad 1.422 20560.9 samples/s\n  back in 0.02 s"
    assert same_story(shown, "step 40/80 fp16 a0 loss 0.5508 scale 32768 grad 1.423 11.0 samples/s\n  back in 1.5 s")
    assert same_story(shown, "step 40/80 fp16 a0 loss 0.5510 scale 32768 grad 1.421 1.0 samples/s\n  back in 1 s")
    assert not same_story(shown, "step 40/80 fp16 a0 loss 0.5514 scale 32768 grad 1.422 1.0 samples/s\n  back in 1 s")
    assert not same_story(shown, "step 40/80 fp16 a0 loss 0.5507 scale 32768 grad 1.420 1.0 samples/s\n  back in 1 s")
    assert not same_story(shown, "step 40/80 fp16 a0 loss 0.5507 scale 16384 grad 1.422 1.0 samples/s\n  back in 1 s")
    assert not same_story(shown, "step 40/80 fp16 a0 loss 0.5507 scale 32768 grad 1.422 1.0 samples/s")
    bf16 = "step 50/80 bf16 a1 loss 0.5360 scale - grad 1.260 1.0 samples/s"
    assert same_story(bf16, "step 50/80 bf16 a1 loss 0.5390 scale - grad 1.252 2.0 samples/s")  # one bf16 step
    assert not same_story(bf16, "step 50/80 bf16 a1 loss 0.5410 scale - grad 1.260 2.0 samples/s")
    fp32 = "step 50/80 fp32 a2 loss 0.5360 scale - grad 1.260 1.0 samples/s"
    assert not same_story(fp32, "step 50/80 fp32 a2 loss 0.5357 scale - grad 1.260 2.0 samples/s")


def test_the_tutorial_runs_as_written(tmp_path: Path) -> None:
    shutil.copytree(REPO / "examples" / "tutorial", tmp_path / "examples" / "tutorial")
    (tmp_path / "tests").symlink_to(REPO / "tests")  # tests/cluster/build-s3.sh, as from the repository root
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "KUBE", "MPJOB_LAUNCH"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env = warm.for_ranks(env)  # the trainer processes `mpjob run` starts are forked warm
    with_s3 = versitygw_cached() and port_free(S3_PORT)
    shown = os.environ.get("MPJOB_TUTORIAL_OUTPUT")  # a folder: keep each block's output (to paste)
    ran: list[Block] = []
    try:
        for block in tutorial_blocks(TUTORIAL.read_text()):
            if "s3" in block.tags and not with_s3:
                continue
            done = subprocess.run(
                ["bash", "-c", block.script],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=BLOCK_TIMEOUT,
            )
            if shown:
                Path(shown).mkdir(parents=True, exist_ok=True)
                (Path(shown) / f"line{block.line:04d}.txt").write_text(
                    block.script + "----\n" + done.stdout + done.stderr
                )
            assert done.returncode == 0, (
                f"docs/tutorial.md line {block.line}:\n{block.script}\n{done.stdout}{done.stderr}"
            )
            if shows_its_run(block):
                printed = done.stdout + done.stderr
                assert same_story(block.shown, printed), (
                    f"docs/tutorial.md line {block.line} shows:\n{block.shown}\nthe run printed:\n{printed}"
                )
            ran.append(block)
    finally:
        pid = tmp_path / "runs" / "s3-server.pid"
        if pid.exists():  # the tutorial stops its S3 server; a failed block may have left it
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid.read_text()), signal.SIGTERM)

    runs = tmp_path / "runs"
    fault = report(runs / "tutorial")
    assert [(a["precision"], a["reason"]) for a in fault["attempts"]] == [
        ("fp16", "NumericFault"),
        ("bf16", "Succeeded"),
    ]
    assert "fp32 replayed" in fault["attempts"][0]["message"]  # the termination report was read (relative --out)
    skipped = report(runs / "tutorial-bad-data")
    assert skipped["phase"] == "Succeeded" and len(skipped["attempts"]) == 1
    assert skipped["skipped"]["count"] == 1 and skipped["skipped"]["samples"] == 1
    killed = report(runs / "killed")
    assert killed["phase"] == "Succeeded" and killed["precision"] == "bf16"
    # the kill lands before or after the in-place fallback, by the machine's speed
    reasons = [a["reason"] for a in killed["attempts"]]
    assert reasons.count("Suspended") == 1 and reasons[-1] == "Succeeded"
    resumed = killed["attempts"][reasons.index("Suspended") + 1]
    assert resumed["startStep"] > 0 and not resumed.get("inPlace")  # a new process, from a checkpoint
    if with_s3:
        assert report(runs / "tutorial-s3")["phase"] == "Succeeded"
        assert list((runs / "s3-data" / "tutorial" / "mpjob").rglob("manifest.json"))
        assert not (runs / "tutorial-s3" / "checkpoints").exists()  # nothing on the local disk
