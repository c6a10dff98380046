"""The warm starts the trainer tests run their processes with (tests/warm): a forked child must
be the process a fresh `python -m ...` or `python script.py` would have been, and must really
be forked (a silent fall back to fresh starts would cost the suite its time again)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import warm
from tests.helpers import children, gone, wait_for
from tests.warm.client import OWNER, SHARED

pytestmark = [pytest.mark.unit, pytest.mark.process]

PROBE = """
import json, os, sys
print(json.dumps({
    "argv": sys.argv, "cwd": os.getcwd(), "name": __name__, "ppid": os.getppid(),
    "pgid": os.getpgid(0), "pid": os.getpid(), "path0": sys.path[0],
    "env": os.environ.get("PROBE_VALUE"), "torch": "torch" in sys.modules,
}))
sys.stderr.write("to stderr\\n")
raise SystemExit(int(sys.argv[1]))
"""


def alone() -> dict[str, str]:
    """This environment without the parallel workers' shared servers: a process started with it
    starts its own."""
    return {k: v for k, v in os.environ.items() if k not in (SHARED, OWNER)}


def probe(tmp_path: Path) -> Path:
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    return script


def test_a_script_runs_as_main_with_its_argv_cwd_env_streams_and_exit_status(tmp_path: Path) -> None:
    script, cwd = probe(tmp_path), tmp_path / "elsewhere"
    cwd.mkdir()
    env = {**os.environ, "PROBE_VALUE": "given"}
    done = warm.run([sys.executable, str(script), "3"], env=env, cwd=cwd, capture_output=True, text=True, timeout=60)
    seen = json.loads(done.stdout)
    assert done.returncode == 3 and done.stderr == "to stderr\n"
    assert seen["argv"] == [str(script), "3"] and seen["name"] == "__main__"
    assert (seen["cwd"], seen["path0"], seen["env"]) == (str(cwd), str(tmp_path), "given")
    # Forked by the server, which imported torch before: not a child of this process.
    assert seen["torch"] and seen["ppid"] != os.getpid()


def test_a_module_runs_as_main_with_the_working_directory_first_on_its_path(tmp_path: Path) -> None:
    (tmp_path / "probe_module.py").write_text(PROBE)
    done = warm.run(
        [sys.executable, "-m", "probe_module", "0"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    seen = json.loads(done.stdout)
    assert done.returncode == 0 and seen["name"] == "__main__" and seen["path0"] == str(tmp_path)
    assert seen["argv"] == [str(tmp_path / "probe_module.py"), "0"] and seen["ppid"] != os.getpid()


def test_an_uncaught_exception_prints_its_traceback_and_exits_1(tmp_path: Path) -> None:
    script = tmp_path / "boom.py"
    script.write_text("raise ValueError('boom')\n")
    done = warm.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "ValueError: boom" in done.stderr


ENDINGS = {
    "end of the module": "",
    "exit with a message": "sys.exit('stopped: bad input')",
    "exit 300 (the status is its low byte)": "sys.exit(300)",
    "exit True": "sys.exit(True)",
    "an uncaught KeyboardInterrupt": "raise KeyboardInterrupt",
    "an exception in an atexit handler": "atexit.register(lambda: 1 / 0)",
}
ENDING = """
import atexit, sys, threading, time
atexit.register(lambda: print('atexit ran', flush=False))
def late():
    time.sleep(0.3)
    print('thread joined', flush=False)
threading.Thread(target=late).start()
print('buffered', end='')
{ending}
"""


@pytest.mark.parametrize("ending", list(ENDINGS.values()), ids=list(ENDINGS))
def test_a_child_ends_as_a_fresh_interpreter_ends(tmp_path: Path, ending: str) -> None:
    """The child skips the interpreter's release of every module (its exit would copy the
    server's heap page by page): what comes before it must be the same as a fresh start's,
    the non-daemon threads joined, the atexit handlers run, buffered output flushed, the status
    or the signal."""
    script = tmp_path / "ending.py"
    script.write_text(ENDING.format(ending=ending))
    done = warm.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    fresh = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (fresh.returncode, fresh.stdout)
    assert done.stdout.startswith("bufferedthread joined\natexit ran")
    assert done.stderr.splitlines()[-1:] == fresh.stderr.splitlines()[-1:]


def test_a_child_in_its_own_session_dies_by_its_process_group_and_reports_the_signal(tmp_path: Path) -> None:
    script = tmp_path / "wait.py"
    script.write_text("import sys, time\nprint('up', flush=True)\ntime.sleep(60)\n")
    proc = warm.Popen([sys.executable, str(script)], stdout=warm.PIPE, text=True, start_new_session=True)
    assert proc.stdout is not None and proc.stdout.readline() == "up\n"
    assert proc.poll() is None and os.getpgid(proc.pid) == proc.pid
    os.killpg(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL
    proc.stdout.close()


def test_a_timeout_kills_the_child_and_raises_as_subprocess_does(tmp_path: Path) -> None:
    script = tmp_path / "slow.py"
    script.write_text("import time\ntime.sleep(60)\n")
    with pytest.raises(subprocess.TimeoutExpired):
        warm.run([sys.executable, str(script)], capture_output=True, timeout=0.5)


def test_pythonpath_comes_after_the_scripts_folder_as_in_a_fresh_interpreter(tmp_path: Path) -> None:
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "probe_helper.py").write_text("WHERE = 'lib'\n")
    script = tmp_path / "uses.py"
    script.write_text(
        "import json, os, sys, probe_helper\n"
        "print(json.dumps({'where': probe_helper.WHERE, 'path': sys.path[:2], 'ppid': os.getppid()}))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "lib")}
    done = warm.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60)
    fresh = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    seen, expected = json.loads(done.stdout), json.loads(fresh.stdout)
    assert (
        (seen["where"], seen["path"])
        == (expected["where"], expected["path"])
        == ("lib", [str(tmp_path), str(tmp_path / "lib")])
    )
    assert seen["ppid"] != os.getpid()  # forked by the server, not started fresh


def test_what_a_fork_cannot_honour_starts_fresh(tmp_path: Path) -> None:
    """A start-up setting of the interpreter that differs from the server's (here the thread
    count the math libraries read as they load) cannot be applied after the fork: that process
    starts fresh, as this process's child."""
    script = probe(tmp_path)
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    done = warm.run([sys.executable, str(script), "0"], env=env, capture_output=True, text=True, timeout=120)
    seen = json.loads(done.stdout)
    assert seen["ppid"] == os.getpid() and not seen["torch"]


def test_the_server_ends_with_the_test_process_that_started_it(tmp_path: Path) -> None:
    """A test process killed outright leaves no server behind."""
    code = (
        "import sys, time; from tests import warm\n"
        f"warm.run([sys.executable, {str(probe(tmp_path))!r}, '0'], capture_output=True, timeout=60)\n"
        "print(flush=True); time.sleep(60)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=Path(__file__).resolve().parents[2],
        stdout=subprocess.PIPE,
        text=True,
        env=alone(),
    )
    assert parent.stdout is not None and parent.stdout.readline() == "\n"
    servers = children(parent.pid)
    assert servers, "the warm-start server is not running"
    parent.kill()
    parent.wait()
    wait_for(lambda: all(gone(pid) for pid in servers), 30, message="the server ended")
    parent.stdout.close()


def test_parallel_workers_share_one_server_that_ends_with_their_parent(tmp_path: Path) -> None:
    """Under parallel workers one server of a kind serves them all: the second worker's child is
    forked by the server the first worker started, which outlived it; their parent's end ends it."""
    worker = (
        "import sys; from tests import warm\n"
        f"done = warm.run([sys.executable, {str(probe(tmp_path))!r}, '0'], capture_output=True, text=True)\n"
        "print(done.stdout.strip(), flush=True)\n"
    )
    parent_code = (
        "import subprocess, sys, time; from tests import warm\n"
        "warm.share_with_workers()\n"
        f"for _ in range(2): subprocess.run([sys.executable, '-c', {worker!r}], check=True)\n"
        "print('both ended', flush=True); time.sleep(60)\n"
    )
    repo = Path(__file__).resolve().parents[2]
    parent = subprocess.Popen(
        [sys.executable, "-c", parent_code], cwd=repo, stdout=subprocess.PIPE, text=True, env=alone()
    )
    assert parent.stdout is not None
    first, second = (json.loads(parent.stdout.readline()) for _ in range(2))
    assert first["ppid"] == second["ppid"] and first["torch"] and second["torch"]
    assert parent.stdout.readline() == "both ended\n" and not gone(first["ppid"])
    parent.kill()
    parent.wait()
    wait_for(lambda: gone(first["ppid"]), 30, message="the shared server ended with the workers' parent")
    parent.stdout.close()


def test_the_trainer_module_runs_with_nothing_on_stderr_a_fresh_start_would_not_print(tmp_path: Path) -> None:
    """The server imported mpjob_trainer.__main__; running it as `-m` must not warn of that."""
    done = warm.run([sys.executable, "-m", "mpjob_trainer", "--help"], capture_output=True, text=True, timeout=60)
    fresh = subprocess.run(
        [sys.executable, "-m", "mpjob_trainer", "--help"], capture_output=True, text=True, timeout=120
    )
    assert (done.returncode, done.stdout, done.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)


@pytest.mark.parametrize("argv", [["operator", "--help"], ["run", "--help"], ["run", "missing.yaml"]])
def test_the_mpjob_command_is_forked_by_its_own_server_and_says_what_a_fresh_start_says(argv: list[str]) -> None:
    """The operator and `mpjob run` start from the server that has imported their modules."""
    command = [sys.executable, "-m", "mpjob.cli", *argv]
    with warm.Popen(command, stdout=warm.PIPE, stderr=warm.PIPE, text=True) as proc:
        out, err = proc.communicate(timeout=60)
    fresh = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert proc.forked and (proc.returncode, out, err) == (fresh.returncode, fresh.stdout, fresh.stderr)


def test_a_forked_kubernetes_client_loads_the_kubeconfig_its_own_environment_names(tmp_path: Path) -> None:
    """The client reads KUBECONFIG when it is imported, which was in the server."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\ncurrent-context: named-by-the-env\ncontexts: []\n")
    command = [sys.executable, "-m", "mpjob.cli", "status", "some-job"]
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    done = warm.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "named-by-the-env" in done.stdout + done.stderr, done
    fresh = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert (done.stdout, done.stderr) == (fresh.stdout, fresh.stderr)


# The ranks a launcher starts: a cold interpreter stands in for each (tests/warm/standin.py).

RANK = """
import json, os, signal, sys
def ended(sig, frame):
    print("got", sig, flush=True)
    raise SystemExit(44)
signal.signal(signal.SIGTERM, ended)
print(json.dumps({"pid": os.getpid(), "ppid": os.getppid(), "torch": "torch" in sys.modules,
                  "argv": sys.argv, "cwd": os.getcwd(), "env": os.environ.get("PROBE_VALUE")}), flush=True)
sys.stderr.write("to stderr\\n")
how = sys.argv[1]
if how == "wait":
    signal.pause()
elif how == "abort":
    os.abort()
raise SystemExit(int(how))
"""


def start_rank(tmp_path: Path, how: str, **env: str) -> tuple[subprocess.Popen[str], dict[str, object]]:
    """A rank as a launcher starts it: a plain subprocess, its own session, the ranks' environment."""
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    proc = subprocess.Popen(
        [sys.executable, str(script), how],
        env={**warm.for_ranks(), "PROBE_VALUE": "given", **env},
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    return proc, json.loads(proc.stdout.readline())


def test_a_launchers_rank_is_forked_by_the_server_and_ends_with_its_exit_status(tmp_path: Path) -> None:
    proc, seen = start_rank(tmp_path, "3")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 3 and (out, err) == ("", "to stderr\n")
    assert seen["torch"] and seen["ppid"] != proc.pid and seen["pid"] != proc.pid  # forked, not run here
    assert (seen["argv"], seen["cwd"], seen["env"]) == ([str(tmp_path / "rank.py"), "3"], str(tmp_path), "given")


def test_a_signal_to_the_stand_in_reaches_the_rank_and_its_ending_comes_back(tmp_path: Path) -> None:
    proc, seen = start_rank(tmp_path, "wait")
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 44 and out == f"got {int(signal.SIGTERM)}\n"
    assert gone(int(seen["pid"]))  # type: ignore[call-overload]


def test_a_rank_killed_by_a_signal_leaves_its_stand_in_killed_by_the_same_signal(tmp_path: Path) -> None:
    proc, _ = start_rank(tmp_path, "abort")
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGABRT


@pytest.fixture
def own_servers() -> Iterator[None]:
    """Servers of this test's own: it kills one or hands it broken requests, which the servers
    the workers share must not meet."""
    with warm.own_servers():
        yield


def trainer_server() -> int:
    """The pid of this test process's own trainer warm-start server."""
    sock = str(Path(warm.for_ranks()["MPJOB_WARM_DIR"]) / "trainer.sock")
    (server,) = [pid for pid in children(os.getpid()) if sock in Path(f"/proc/{pid}/cmdline").read_text()]
    return server


@pytest.mark.usefixtures("own_servers")
def test_a_client_gone_before_its_answer_leaves_the_server_serving(tmp_path: Path) -> None:
    """A start whose client is gone by the time the server answers with the pid (a launcher that
    SIGKILLs its ranks' stand-ins as they start): the answer finds no one, and the server serves
    the next start (it once died there, and every later start of its test process failed)."""
    script = probe(tmp_path)
    sock = Path(warm.for_ranks()["MPJOB_WARM_DIR"]) / "trainer.sock"
    request = {"module": False, "target": str(script), "args": ["0"], "env": dict(os.environ),
               "cwd": str(tmp_path), "new_session": True}  # fmt: skip
    with open(os.devnull, "wb") as null:
        for _ in range(3):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
                client.connect(str(sock))
                socket.send_fds(client, [json.dumps(request).encode() + b"\n"], [null.fileno()] * 3)
    done = warm.run([sys.executable, str(script), "0"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and json.loads(done.stdout)["ppid"] != os.getpid()


@pytest.mark.usefixtures("own_servers")
def test_a_server_that_died_is_started_again_on_the_next_start(tmp_path: Path) -> None:
    script = probe(tmp_path)
    server = trainer_server()
    os.kill(server, signal.SIGKILL)
    wait_for(lambda: gone(server), 30, message="the server killed")
    done = warm.run([sys.executable, str(script), "0"], capture_output=True, text=True, timeout=60)
    seen = json.loads(done.stdout)
    assert done.returncode == 0 and seen["ppid"] not in (os.getpid(), server) and seen["torch"]


def test_a_sigkilled_stand_in_takes_its_rank_with_it(tmp_path: Path) -> None:
    """The launcher's SIGKILL (or its death signal) cannot be passed on: the server kills the
    rank when the stand-in's connection closes."""
    proc, seen = start_rank(tmp_path, "wait")
    rank = int(seen["pid"])  # type: ignore[call-overload]
    assert not gone(rank)
    proc.kill()
    proc.communicate(timeout=60)
    wait_for(lambda: gone(rank), 30, message="the rank to die with its stand-in")


@pytest.mark.skipif(os.environ.get("MPJOB_TEST_COLD") == "1", reason="every process starts cold: no stand-ins")
def test_a_stand_in_names_the_rank_forked_for_it_while_it_lives(tmp_path: Path) -> None:
    """A test that SIGKILLs a launcher waits for its ranks: warm ones are the server's children."""
    proc, seen = start_rank(tmp_path, "wait")
    rank = int(seen["pid"])  # type: ignore[call-overload]
    wait_for(lambda: warm.forked_for([proc.pid]) == [rank], 30, message="the stand-in's record of its rank")
    assert warm.forked_for([os.getpid()]) == []  # this process stands in for none
    proc.kill()
    proc.communicate(timeout=60)
    wait_for(lambda: gone(rank), 30, message="the rank to die with its stand-in")
    assert warm.forked_for([proc.pid]) == []  # the record outlives its stand-in and names nothing


@pytest.mark.usefixtures("own_servers")
def test_a_rank_dies_with_its_sigkilled_stand_in_by_itself_as_a_fresh_rank_dies_with_its_launcher(
    tmp_path: Path,
) -> None:
    """Not when the server gets round to it: with the server stopped, the rank still goes (a rank
    that outlived its SIGKILLed launcher once checkpointed with its peers after its node was lost)."""
    proc, seen = start_rank(tmp_path, "wait")
    rank, server = int(seen["pid"]), trainer_server()  # type: ignore[call-overload]
    os.kill(server, signal.SIGSTOP)
    try:
        proc.kill()
        proc.communicate(timeout=60)
        wait_for(lambda: gone(rank), 30, message="the rank to die with its stand-in, the server stopped")
    finally:
        os.kill(server, signal.SIGCONT)


def test_a_rank_whose_start_up_environment_differs_runs_cold_in_its_own_interpreter(tmp_path: Path) -> None:
    proc, seen = start_rank(tmp_path, "0", OMP_NUM_THREADS="2")
    proc.communicate(timeout=120)
    assert proc.returncode == 0 and seen["pid"] == proc.pid and not seen["torch"]
    said = [json.loads(line) for line in (Path(warm.for_ranks()["MPJOB_WARM_DIR"]) / "cold.log").open()]
    (why,) = [line["why"] for line in said if line["pid"] == proc.pid]  # where the suite's cold starts are found
    assert "start-up environment differs" in why and "OMP_NUM_THREADS" in why


#: Stands in for the `mpjob` console script: says whether the `mpjob` command's server forked it.
CLI_PROBE = """
import json, sys
print(json.dumps({"argv": sys.argv[1:], "forked": "mpjob.cli" in sys.modules}))
"""


@pytest.mark.parametrize(("argv", "forked"), [(["operator", "--namespace=a"], True), (["run", "job.yaml"], False)])
def test_the_operator_a_pod_starts_is_forked_by_the_mpjob_commands_server_and_nothing_else_of_it(
    tmp_path: Path, argv: list[str], forked: bool
) -> None:
    """The chart's pods run `mpjob operator`, the console script whose shebang line starts the
    interpreter on it: that interpreter stands in for the operator. Another `mpjob` command in a
    pod (none today) is no operator and starts as it came."""
    console = tmp_path / "mpjob"  # a console script of that name, here the probe
    console.write_text(CLI_PROBE)
    env = warm.for_ranks(cli=True)
    done = subprocess.run([sys.executable, str(console), *argv], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and json.loads(done.stdout) == {"argv": argv, "forked": forked}, done.stderr


def test_the_real_operator_command_stood_in_for_says_what_a_fresh_start_says() -> None:
    real = str(Path(sys.executable).with_name("mpjob"))
    command = [real, "operator", "--help"]
    stood_in = subprocess.run(command, env=warm.for_ranks(cli=True), capture_output=True, text=True, timeout=60)
    fresh = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert stood_in.returncode == 0 and "--namespace" in stood_in.stdout, stood_in.stderr
    assert (stood_in.returncode, stood_in.stdout, stood_in.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)


def test_a_rank_command_started_cold_on_purpose_is_not_handed_to_a_server(tmp_path: Path) -> None:
    """What made the client start it cold (here a preexec_fn, which sets a limit in the child)
    holds for the process itself: its interpreter does not stand in for it."""
    script = probe(tmp_path)
    done = warm.Popen(
        [sys.executable, str(script), "0"], env=warm.for_ranks(), stdout=warm.PIPE, text=True, preexec_fn=os.getpid
    )
    out, _ = done.communicate(timeout=120)
    seen = json.loads(out)
    assert done.returncode == 0 and seen["ppid"] == os.getpid() and not seen["torch"]


def test_the_trainers_console_script_as_a_pod_names_it_is_forked_and_says_what_a_fresh_start_says(
    tmp_path: Path,
) -> None:
    """The operator's pods run `mpjob-launch ... -- mpjob-trainer`: the launcher execs the
    console script, whose shebang line starts the interpreter on it."""
    console = tmp_path / "mpjob-trainer"  # a console script of that name, here the probe
    console.write_text(PROBE)
    proc = subprocess.run(
        [sys.executable, str(console), "0"], env=warm.for_ranks(), capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0 and json.loads(proc.stdout)["torch"], proc.stderr
    real = str(Path(sys.executable).with_name("mpjob-trainer"))
    stood_in = subprocess.run([real, "--help"], env=warm.for_ranks(), capture_output=True, text=True, timeout=60)
    fresh = subprocess.run([real, "--help"], capture_output=True, text=True, timeout=120)
    assert (stood_in.returncode, stood_in.stdout, stood_in.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
