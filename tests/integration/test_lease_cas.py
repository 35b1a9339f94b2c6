"""The CAS lease across real processes: races, dead and hung holders, bad files, epochs."""

from __future__ import annotations

import errno
import fcntl
import itertools
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ferry.core.errors import LeaseHeldError, StateDirError
from ferry.proc.liveness import Liveness, probe
from ferry.proc.process import ProcessIdentity, identity_of, read_stat, self_identity
from ferry.storage.local.lease import (
    Lease,
    LeaseLostError,
    LeaseStore,
    LeaseUnreadableError,
    boot_clock,
)
from ferry.storage.local.statedir import ensure_home

pytestmark = pytest.mark.timeout(120)


def wait_until(condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met before the deadline")
        time.sleep(0.01)


@pytest.fixture
def lease_path(tmp_path: Path) -> Path:
    return Path(ensure_home(tmp_path / "home")) / "lease.json"


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    try:
        yield procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
            proc.wait(timeout=30)
            for stream in (proc.stdin, proc.stdout):
                if stream is not None and not stream.closed:
                    stream.close()


def start_python(
    children: list[subprocess.Popen[str]], code: str, *args: str
) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != "FERRY_FAILPOINTS"}
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    children.append(proc)
    return proc


def read_line(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, f"child exited early with {proc.wait()}"
    return line.strip()


# --- the race ------------------------------------------------------------------------

RACER = """
    import sys, time
    from pathlib import Path
    from ferry.core.errors import LeaseHeldError
    from ferry.storage.local.lease import LeaseStore, boot_clock
    from ferry.proc.process import self_identity

    store = LeaseStore(Path(sys.argv[1]), ttl_s=60.0)
    me = self_identity()
    print("ready", flush=True)
    sys.stdin.read(1)  # the start barrier: everyone races at once
    deadline = time.monotonic() + 60
    while True:
        try:
            lease = store.acquire(me)
            break
        except LeaseHeldError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.002)
    got = boot_clock()
    # While we hold it, nobody else may: the file must still name us.
    assert store.read() == lease
    time.sleep(0.005)  # hold it a moment, so holding intervals are not empty
    left = boot_clock()
    assert store.release(lease)
    print(lease.epoch, repr(got), repr(left), flush=True)
"""


def test_twenty_racing_processes_get_distinct_epochs_and_never_overlap(
    lease_path: Path, children: list[subprocess.Popen[str]]
) -> None:
    racers = [start_python(children, RACER, str(lease_path)) for _ in range(20)]
    for proc in racers:
        assert read_line(proc) == "ready"
    for proc in racers:
        assert proc.stdin is not None
        proc.stdin.write("g")
        proc.stdin.close()
    holds: list[tuple[int, float, float]] = []
    for proc in racers:
        epoch, got, left = read_line(proc).split()
        holds.append((int(epoch), float(got), float(left)))
        assert proc.wait(timeout=60) == 0
    epochs = sorted(h[0] for h in holds)
    assert epochs == list(range(1, 21)), "distinct, gap-free epochs"
    by_time = sorted(holds, key=lambda h: h[1])
    assert [h[0] for h in by_time] == epochs, "epochs strictly increase with time"
    for before, after in itertools.pairwise(by_time):
        assert before[2] < after[1], "two holders at once"
    final = LeaseStore(lease_path, 1.0).read()
    assert final is not None and final.epoch == 20 and final.holder is None


# --- dead and hung holders -------------------------------------------------------------

HOLDER = """
    import os, signal, sys
    from pathlib import Path
    from ferry.core.errors import FerryError
    from ferry.storage.local.lease import LeaseStore
    from ferry.proc.process import self_identity

    store = LeaseStore(Path(sys.argv[1]), ttl_s=float(sys.argv[2]))
    lease = store.acquire(self_identity())
    print("held", lease.epoch, flush=True)
    mode = sys.argv[3]
    if mode == "hold":
        sys.stdin.read()  # hold without renewing until told (stdin closed)
        sys.exit(0)
    # "stop": freeze ourselves right here, outside the lease's lock (a SIGSTOP from
    # outside could land inside the short critical section and block everyone).
    os.kill(os.getpid(), signal.SIGSTOP)
    while True:
        try:
            lease = store.renew(lease)
        except FerryError as e:
            print("lost", e.code, flush=True)
            sys.exit(0)
"""


def test_a_dead_holder_is_replaced_at_once(
    lease_path: Path, children: list[subprocess.Popen[str]]
) -> None:
    holder = start_python(children, HOLDER, str(lease_path), "3600", "hold")
    assert read_line(holder) == "held 1"
    held = LeaseStore(lease_path, 1.0).read()
    assert held is not None and held.holder is not None
    holder.kill()
    holder.wait()
    assert probe(held.holder) is Liveness.DEAD
    store = LeaseStore(lease_path, 60.0)
    assert not store.expired(held), "the dead holder's lease has not expired"
    lease = store.acquire(self_identity())
    assert lease.epoch == 2 and lease.holder == self_identity()


def test_a_live_holder_refuses_with_lease_held(
    lease_path: Path, children: list[subprocess.Popen[str]]
) -> None:
    holder = start_python(children, HOLDER, str(lease_path), "3600", "hold")
    assert read_line(holder) == "held 1"
    with pytest.raises(LeaseHeldError) as caught:
        LeaseStore(lease_path, 60.0).acquire(self_identity())
    err = caught.value
    assert err.code == "lease.held" and err.exit_code == 75
    assert err.details["epoch"] == 1
    assert err.details["holder"]["pid"] == holder.pid
    assert "expires_at" in err.details


def test_a_stopped_holder_is_kept_until_expiry_then_replaced_by_the_clock(
    lease_path: Path, children: list[subprocess.Popen[str]]
) -> None:
    # Deterministic version: a long TTL, and a second store whose clock runs past it.
    holder = start_python(children, HOLDER, str(lease_path), "30", "hold")
    assert read_line(holder) == "held 1"
    os.kill(holder.pid, signal.SIGSTOP)
    now = LeaseStore(lease_path, 30.0)
    with pytest.raises(LeaseHeldError):
        now.acquire(self_identity())  # hung, not dead: wait for expiry
    later = LeaseStore(lease_path, 30.0, clock=lambda: boot_clock() + 31.0)
    assert later.acquire(self_identity()).epoch == 2


def test_a_sigstopped_holder_is_replaced_after_expiry_and_its_renew_fails(
    lease_path: Path, children: list[subprocess.Popen[str]]
) -> None:
    ttl_s = 0.5
    holder = start_python(children, HOLDER, str(lease_path), str(ttl_s), "stop")
    assert read_line(holder) == "held 1"
    wait_until(lambda: (st := read_stat(holder.pid)) is not None and st.state in ("T", "t"))
    store = LeaseStore(lease_path, 60.0)
    me = self_identity()
    taken: list[Lease] = []

    def try_take() -> bool:
        before = store.read()
        assert before is not None and before.holder is not None
        attempt_at = boot_clock()
        try:
            taken.append(store.acquire(me))
        except LeaseHeldError:
            assert attempt_at < before.expires_boot_s  # refused only while unexpired
            return False
        # Taken only once the hung holder's lease had expired.
        assert boot_clock() >= before.expires_boot_s
        assert before.holder.pid == holder.pid
        return True

    wait_until(try_take)
    assert taken[0].epoch == 2
    os.kill(holder.pid, signal.SIGCONT)
    assert read_line(holder) == "lost lease.lost"
    assert holder.wait(timeout=30) == 0
    assert store.read() == taken[0], "the woken holder wrote nothing"


def test_renew_and_release_are_compare_and_swap(lease_path: Path) -> None:
    store = LeaseStore(lease_path, 60.0)
    me = self_identity()
    first = store.acquire(me)
    renewed = store.renew(first)
    assert renewed.epoch == first.epoch and renewed.expires_boot_s >= first.expires_boot_s
    second = store.acquire(me)  # a re-acquire by the holder bumps the epoch
    assert second.epoch == first.epoch + 1
    with pytest.raises(LeaseLostError) as caught:
        store.renew(first)
    assert caught.value.code == "lease.lost" and caught.value.exit_code == 75
    assert store.release(first) is False
    assert store.read() == second
    assert store.release(second) is True
    released = store.read()
    assert released is not None and released.holder is None and released.epoch == second.epoch
    with pytest.raises(LeaseLostError):
        store.renew(second)
    assert store.acquire(me).epoch == second.epoch + 1


# --- epochs never go backwards -----------------------------------------------------------


def test_epochs_never_go_backwards_even_if_the_lease_file_is_removed(lease_path: Path) -> None:
    store = LeaseStore(lease_path, 60.0)
    me = self_identity()
    for expected in (1, 2, 3):
        assert store.acquire(me).epoch == expected
    lease_path.unlink()
    assert store.read() is None
    # The service passes the highest epoch the journal has seen.
    assert store.acquire(me, min_epoch=3).epoch == 4
    # A lease file ahead of the journal wins too.
    assert store.acquire(me, min_epoch=1).epoch == 5


# --- bad lease files ----------------------------------------------------------------------


def holder_json() -> dict[str, object]:
    return self_identity().to_json()


GOOD = {
    "v": 1,
    "epoch": 4,
    "holder": None,
    "acquired_at": 1.0,
    "renewed_at": 1.0,
    "expires_at": 1.0,
    "expires_boot_s": 1.0,
}

BAD_FILES: dict[str, tuple[bytes, str]] = {
    "empty": (b"", "lease.unreadable"),
    "whitespace": (b"  \n", "lease.unreadable"),
    "truncated": (json.dumps(GOOD).encode()[:20], "lease.unreadable"),
    "not json": (b"\x00\xff garbage", "lease.unreadable"),
    "a list": (b"[1, 2]", "lease.unreadable"),
    "newer version": (json.dumps({**GOOD, "v": 2}).encode(), "lease.version"),
    "version zero": (json.dumps({**GOOD, "v": 0}).encode(), "lease.unreadable"),
    "no version": (
        json.dumps({k: v for k, v in GOOD.items() if k != "v"}).encode(),
        "lease.unreadable",
    ),
    "epoch a string": (json.dumps({**GOOD, "epoch": "4"}).encode(), "lease.unreadable"),
    "epoch a bool": (json.dumps({**GOOD, "epoch": True}).encode(), "lease.unreadable"),
    "epoch negative": (json.dumps({**GOOD, "epoch": -1}).encode(), "lease.unreadable"),
    "holder a string": (json.dumps({**GOOD, "holder": "me"}).encode(), "lease.unreadable"),
    "holder pid a string": (
        json.dumps({**GOOD, "holder": {**holder_json(), "pid": "1"}}).encode(),
        "lease.unreadable",
    ),
    "time missing": (
        json.dumps({k: v for k, v in GOOD.items() if k != "expires_boot_s"}).encode(),
        "lease.unreadable",
    ),
    "time a string": (json.dumps({**GOOD, "expires_at": "soon"}).encode(), "lease.unreadable"),
    "huge": (b" " * (70 * 1024) + b"{}", "lease.unreadable"),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_a_bad_lease_file_gives_a_coded_error_and_is_not_overwritten(
    lease_path: Path, case: str
) -> None:
    content, code = BAD_FILES[case]
    lease_path.write_bytes(content)
    store = LeaseStore(lease_path, 60.0)
    for action in (store.read, lambda: store.acquire(self_identity())):
        with pytest.raises(LeaseUnreadableError) as caught:
            action()
        assert caught.value.code == code
        assert isinstance(caught.value, StateDirError)
    assert lease_path.read_bytes() == content, "never silently overwritten"


def test_reset_moves_a_bad_file_aside_and_keeps_epochs_monotonic(lease_path: Path) -> None:
    lease_path.write_bytes(b"{truncated")
    store = LeaseStore(lease_path, 60.0)
    aside = store.reset(min_epoch=9)
    assert aside is not None and aside.read_bytes() == b"{truncated"
    assert store.acquire(self_identity()).epoch == 10
    assert store.reset(min_epoch=0) is None, "a readable lease is left alone"


def test_a_good_file_with_unknown_fields_reads(lease_path: Path) -> None:
    lease_path.write_bytes(json.dumps({**GOOD, "note": "from a tool"}).encode())
    lease = LeaseStore(lease_path, 60.0).read()
    assert lease is not None and lease.epoch == 4 and lease.holder is None


def test_a_symlink_planted_at_the_lease_file_is_not_followed(
    lease_path: Path, tmp_path: Path
) -> None:
    target = tmp_path / "elsewhere.json"
    target.write_bytes(json.dumps(GOOD).encode())
    lease_path.symlink_to(target)
    with pytest.raises(StateDirError) as caught:
        LeaseStore(lease_path, 60.0).read()
    assert caught.value.code == "state_dir.symlink"
    tmp = lease_path.with_name("lease.json.tmp")
    lease_path.unlink()
    tmp.symlink_to(target)
    with pytest.raises(StateDirError) as caught:
        LeaseStore(lease_path, 60.0).acquire(self_identity())
    assert caught.value.code == "state_dir.symlink"
    assert json.loads(target.read_bytes()) == GOOD, "the link target is untouched"


def test_files_are_private(lease_path: Path) -> None:
    LeaseStore(lease_path, 60.0).acquire(self_identity())
    for path in (lease_path, lease_path.with_name("lease.json.lock")):
        assert path.stat().st_mode & 0o777 == 0o600


def test_a_holder_from_another_boot_is_replaced_at_once(lease_path: Path) -> None:
    me = self_identity()
    ghost = ProcessIdentity(me.pid, me.start_time, "a-previous-boot", me.host)
    store = LeaseStore(lease_path, 3600.0)
    store.acquire(ghost)
    assert store.acquire(me).epoch == 2


def test_an_unknown_holder_counts_as_alive_until_expiry(lease_path: Path) -> None:
    other = identity_of(os.getppid())
    assert other is not None
    LeaseStore(lease_path, 3600.0).acquire(other)
    unsure = LeaseStore(lease_path, 3600.0, probe_holder=lambda _ident: Liveness.UNKNOWN)
    with pytest.raises(LeaseHeldError) as caught:
        unsure.acquire(self_identity())
    assert caught.value.details["holder_liveness"] == "UNKNOWN"
    expired = LeaseStore(
        lease_path,
        3600.0,
        probe_holder=lambda _ident: Liveness.UNKNOWN,
        clock=lambda: boot_clock() + 3601.0,
    )
    assert expired.acquire(self_identity()).epoch == 2


# --- the short lock ---------------------------------------------------------------------


def test_a_lock_held_too_long_gives_lease_busy(lease_path: Path) -> None:
    holder = LeaseStore(lease_path, 60.0)
    # As if its holder were stopped inside the critical section:
    with holder._locked(), pytest.raises(LeaseHeldError) as caught:
        LeaseStore(lease_path, 60.0, lock_timeout_s=0.05).acquire(self_identity())
    assert caught.value.code == "lease.busy" and caught.value.exit_code == 75
    assert holder.acquire(self_identity()).epoch == 1, "free again once released"


@pytest.mark.parametrize("err", [errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP])
def test_a_filesystem_without_flock_is_refused_never_soft_locked(
    lease_path: Path, monkeypatch: pytest.MonkeyPatch, err: int
) -> None:
    def no_flock(_fd: int, _op: int) -> None:
        raise OSError(err, os.strerror(err))

    monkeypatch.setattr(fcntl, "flock", no_flock)
    with pytest.raises(StateDirError) as caught:
        LeaseStore(lease_path, 60.0).acquire(self_identity())
    assert caught.value.code == "state_dir.no_locks"
    assert not lease_path.exists(), "nothing written without the lock"
    monkeypatch.undo()
    assert LeaseStore(lease_path, 60.0).acquire(self_identity()).epoch == 1


def test_a_symlink_at_the_lock_is_refused_naming_the_lock(lease_path: Path) -> None:
    target = lease_path.with_name("elsewhere")
    lease_path.with_name(lease_path.name + ".lock").symlink_to(target)
    with pytest.raises(StateDirError) as caught:
        LeaseStore(lease_path, 60.0).acquire(self_identity())
    assert caught.value.code == "state_dir.symlink"
    assert caught.value.details["errno"] == errno.ELOOP
    assert not target.exists() and not lease_path.exists()


def test_a_process_forked_inside_the_lock_does_not_keep_it(lease_path: Path) -> None:
    """The lock is let go with LOCK_UN, not only by closing: a child forked while it
    was held shares its open file description, and would hold it for its whole life."""
    store = LeaseStore(lease_path, 60.0)
    with store._locked():
        child = os.fork()
        if child == 0:  # (holds every descriptor of the parent until it is killed)
            time.sleep(60)
            os._exit(0)
    try:
        other = LeaseStore(lease_path, 60.0, lock_timeout_s=2.0)
        assert other.acquire(self_identity()).epoch == 1
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
