"""Bounded progress reads: a trainer's metrics endpoint is a tenant's, so a slow drip, a huge
body, a redirect or garbage costs the operator one deadline and one byte cap at most, and the
reads run off the reconcile workers (a request never waits). Only real readings become figures."""

from __future__ import annotations

import contextlib
import socket
import socketserver
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator

import pytest

from mpjob.controller.exposition import Exposition, parse
from mpjob.controller.progress import ProgressReader, Target, figures
from mpjob.controller.scrape import ScrapeError, fetch
from mpjob_contract import metrics as tm
from mpjob_contract.api import AttemptStatus, MixedPrecisionJobStatus
from tests.helpers import free_port
from tests.unit.operator.live_reads import progress_patch, start_news
from tests.unit.operator.test_api_errors import FakeCluster, reconciler

pytestmark = pytest.mark.unit

DEADLINE, CAP = 0.5, 64 * 1024
#: One deadline, with a loaded machine's slack (a test thread starved for seconds): a read
#: bounded per chunk would take the whole drip (20 s), one that waited out the silence 10 s.
ONE_DEADLINE = DEADLINE + 4.0
#: How long the silent endpoint keeps quiet: twice ONE_DEADLINE, so a read that waits it out fails.
SILENCE = 2 * ONE_DEADLINE
HEALTHY = f"{tm.STEP} 30\n{tm.START_STEP} 20\n{tm.LOSS} 2.5\n{tm.LOSS_SCALE} 1024\n{tm.SAMPLES_PER_SECOND} 80\n"


def ok(body: bytes) -> bytes:
    return b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n" + body


class Hostile(socketserver.ThreadingTCPServer):
    """An endpoint that answers every request with `behave(socket)`; counts requests."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, behave: Callable[[socket.socket], None]) -> None:
        self.hits = 0
        self.stopping = threading.Event()
        outer = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                outer.hits += 1
                self.request.recv(4096)
                with contextlib.suppress(OSError):  # the operator hung up: as it should
                    behave(self.request)

        super().__init__(("127.0.0.1", 0), Handler)

    @property
    def port(self) -> int:
        return int(self.server_address[1])


def drip(prefix: bytes) -> Callable[[socket.socket], None]:
    def behave(sock: socket.socket) -> None:
        sock.sendall(prefix)
        for _ in range(2000):
            sock.sendall(b"#")
            time.sleep(0.01)

    return behave


def huge(sock: socket.socket) -> None:
    sock.sendall(ok(b""))
    chunk = b"x" * 65536
    for _ in range(5000):  # 300 MiB, were it all read
        sock.sendall(chunk)


@pytest.fixture
def serve() -> Iterator[Callable[[Callable[[socket.socket], None]], Hostile]]:
    servers: list[Hostile] = []

    def start(behave: Callable[[socket.socket], None]) -> Hostile:
        server = Hostile(behave)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def timed_failure(port: int) -> float:
    started = time.monotonic()
    with pytest.raises(ScrapeError):
        fetch("127.0.0.1", port, deadline=DEADLINE, max_bytes=CAP)
    return time.monotonic() - started


@pytest.mark.parametrize(
    "behave",
    [
        drip(b"HTTP/1.0 200 OK\r\n\r\n"),  # a body that never ends
        drip(b"HTTP/1.0 200 OK\r\nX-Slow: "),  # headers that never end
        lambda sock: time.sleep(SILENCE),  # silence (a daemon thread: no one waits for it)
    ],
    ids=["slow-body", "slow-headers", "silent"],
)
def test_a_slow_endpoint_costs_one_deadline(serve: Callable, behave: Callable) -> None:
    assert timed_failure(serve(behave).port) < ONE_DEADLINE


def test_a_huge_body_is_cut_off_at_the_cap_in_bounded_memory(serve: Callable) -> None:
    server = serve(huge)
    tracemalloc.start()
    try:
        took = timed_failure(server.port)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert took < ONE_DEADLINE and peak < 4 * CAP


def test_a_redirect_is_never_followed(serve: Callable) -> None:
    canary = serve(lambda sock: sock.sendall(ok(HEALTHY.encode())))
    location = f"http://127.0.0.1:{canary.port}/metrics".encode()
    redirect = serve(lambda sock: sock.sendall(b"HTTP/1.0 302 Found\r\nLocation: " + location + b"\r\n\r\n"))
    with pytest.raises(ScrapeError, match="redirects are never followed"):
        fetch("127.0.0.1", redirect.port, deadline=DEADLINE, max_bytes=CAP)
    assert redirect.hits == 1 and canary.hits == 0


@pytest.mark.parametrize(
    "body",
    [
        b"\xff\xfe\x00garbage",
        b"HTTP/1.0 200 OK\r\nContent-Length: 99999\r\n\r\nshort",
        b"no header at all",
        b"HTTP/1.0 200 OK\r\nContent-Length: \xb2\r\n\r\nab",  # a digit to str.isdigit (latin-1's superscript two)
        b"HTTP/1.0 200 OK\r\nContent-Length: " + b"9" * 5000 + b"\r\n\r\nab",  # past what int() converts
    ],
    ids=["not-utf8", "truncated", "not-http", "non-ascii-length", "endless-length"],
)
def test_garbage_is_a_failed_read(serve: Callable, body: bytes) -> None:
    server = serve(lambda sock: sock.sendall(body if body.startswith(b"HTTP") or b"header" in body else ok(body)))
    with pytest.raises(ScrapeError):
        fetch("127.0.0.1", server.port, deadline=DEADLINE, max_bytes=CAP)


def test_unparsable_and_non_finite_values_are_dropped() -> None:
    assert parse("}}} not the exposition format {{{") == Exposition()
    text = f"{tm.STEP} 30\n{tm.LOSS} NaN\n{tm.LOSS_SCALE} +Inf\n{tm.SAMPLES_PER_SECOND} 1e300\nbroken line ((\n"
    assert parse(text) == Exposition(values={tm.STEP: 30.0})


def test_only_real_readings_become_figures() -> None:
    values = parse(HEALTHY)
    assert figures(values, precision="fp16") == {
        "startStep": 20,
        "step": 30,
        "loss": 2.5,
        "lossScale": 1024.0,
        "samplesPerSecond": 80.0,
    }
    assert "lossScale" not in figures(values, precision="bf16")  # a scale exists only in fp16
    placeholders = parse(f"{tm.STEP} 20\n{tm.START_STEP} 20\n{tm.LOSS} 0\n{tm.LOSS_SCALE} 0\n")
    assert figures(placeholders, precision="fp16") == {"startStep": 20}  # no step logged yet


def test_a_read_before_the_trainer_decided_where_it_starts_is_no_reading() -> None:
    undecided = parse(f"{tm.STEP} 0\n{tm.START_STEP} -1\n{tm.LOSS} 0\n{tm.SAMPLES_PER_SECOND} 0\n")
    assert figures(undecided, precision="bf16") == {}  # not a fresh start, not a step, not a loss


@pytest.mark.parametrize(
    ("real", "news"),
    [
        (0, ("StartedFresh", "attempt 1 (bf16) found no checkpoint of its own to resume from and started at step 0")),
        (10, ("Resumed", "attempt 1 (bf16) resumed from checkpoint step 10")),
        (20, None),  # as planned: nothing to correct
    ],
)
def test_the_trainers_own_start_step_replaces_the_planned_one(real: int, news: tuple[str, str] | None) -> None:
    first = AttemptStatus(index=0, precision="fp16", start_step=0, reason="NumericFault", end_step=25)
    status = MixedPrecisionJobStatus(attempts=[first, AttemptStatus(index=1, precision="bf16", start_step=20)])
    found = figures(parse(f"{tm.STEP} {real}\n{tm.START_STEP} {real}\n"), precision="bf16")
    patch = progress_patch(status, found)
    said = start_news(status, found)
    if news is None:
        assert said is None and "attempts" not in patch
        return
    assert [a["startStep"] for a in patch["attempts"]] == [0, real]
    assert said is not None and said.reason == news[0] and said.message.startswith(news[1])
    assert said.type == "Normal" and "planned: checkpoint step 20" in said.message


def wait_until(predicate: Callable[[], object], timeout: float) -> object:
    deadline = time.monotonic() + timeout
    while not (value := predicate()) and time.monotonic() < deadline:
        time.sleep(0.02)
    return value


def test_reads_run_off_the_callers_thread_with_bounded_concurrency(serve: Callable) -> None:
    slow = serve(drip(b"HTTP/1.0 200 OK\r\n\r\n"))
    healthy = serve(lambda sock: sock.sendall(ok(HEALTHY.encode())))
    # The healthy read comes within its deadline even on a starved machine; the dripping ones
    # take all of it, two at a time: 6 s in all.
    deadline = 3.0
    reader = ProgressReader(concurrency=2, deadline=deadline, max_bytes=CAP)
    started = time.monotonic()
    for i in range(4):  # four jobs whose endpoints drip
        reader.request(("ns", f"slow-{i}"), Target(0, "127.0.0.1", "fp16", slow.port))
    # A request never waits for a read: four that did would take four whole deadlines (12 s);
    # eight requests under a loaded CI machine took 0.2 s.
    assert time.monotonic() - started < deadline
    assert len([t for t in threading.enumerate() if t.name.startswith("mpjob-progress")]) <= 2
    target = Target(0, "127.0.0.1", "fp16", healthy.port)
    reader.request(("ns", "healthy"), target)  # behind the four: two deadlines later
    reading = wait_until(lambda: reader.take(("ns", "healthy"), target), 60)  # a wait, not a bound
    assert isinstance(reading, dict) and reading["step"] == 30
    assert reader.take(("ns", "healthy"), Target(1, "127.0.0.1", "fp16", healthy.port)) is None  # another attempt
    reader.close()


def test_a_failing_endpoint_is_asked_again_only_after_a_backoff(serve: Callable) -> None:
    server = serve(lambda sock: sock.sendall(b"HTTP/1.0 500 Oops\r\n\r\n"))
    reader = ProgressReader(concurrency=1, deadline=DEADLINE, max_bytes=CAP)
    target = Target(0, "127.0.0.1", "fp16", server.port)
    reader.request(("ns", "j"), target)
    assert wait_until(lambda: reader._endpoints[("ns", "j")].failures == 1, 60)
    for _ in range(20):
        reader.request(("ns", "j"), target)
    assert server.hits == 1
    reader.close()


def test_a_process_counts_how_long_it_has_read_an_attempt_without_taking_a_reading(serve: Callable) -> None:
    """ProgressReader.unseen_for, which keeps a restarted operator from judging a stall on the
    progressTime another process saw: from this process's first request of the attempt (0.0
    before any), through reads that fail, until it takes a reading (None from then on)."""
    answer = {"fail": True}

    def behave(sock: socket.socket) -> None:
        sock.sendall(b"HTTP/1.0 500 Oops\r\n\r\n" if answer["fail"] else ok(HEALTHY.encode()))

    server, now = serve(behave), [100.0]
    reader = ProgressReader(concurrency=1, deadline=DEADLINE, max_bytes=CAP, clock=lambda: now[0])
    key, target = ("ns", "j"), Target(3, "127.0.0.1", "fp16", server.port)
    assert reader.unseen_for(key, 3) == 0.0  # not asked yet
    reader.request(key, target)
    assert wait_until(lambda: server.hits == 1, 60)
    now[0] = 170.0
    assert reader.unseen_for(key, 3) == 70.0  # its read failed: still unseen
    answer["fail"] = False

    def answered() -> object:
        reader.request(key, target)  # past the failed read's backoff on the next pass
        now[0] += 1.0
        return reader.take(key, target)

    assert wait_until(answered, 60)
    assert reader.unseen_for(key, 3) is None
    assert reader.unseen_for(key, 4) == 0.0  # another attempt: this process has not read it
    reader.close()


def test_a_standby_forgets_what_it_read_while_it_acted() -> None:
    """A replica outranked by a peer stops acting; what its reads saw then is not its sight once
    it acts again (the peer may have run long after): `unseen_for` starts anew."""
    now = [100.0]
    made = reconciler(FakeCluster(None))
    made.progress = ProgressReader(concurrency=1, deadline=DEADLINE, max_bytes=CAP, clock=lambda: now[0])
    made.progress.request(("ns", "j"), Target(0, "127.0.0.1", "fp16", free_port()))
    now[0] = 150.0
    assert made.progress.unseen_for(("ns", "j"), 0) == 50.0
    made.peering = Outranked()  # type: ignore[assignment]
    made.handle(("ns", "j"), True)
    assert made.progress.unseen_for(("ns", "j"), 0) == 0.0
    made.progress.close()


class Outranked:
    def active(self, namespace: str) -> bool:
        return False
