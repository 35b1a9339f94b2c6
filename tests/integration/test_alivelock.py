"""The inherited alive-lock: held while any process that inherited it lives."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ferry.proc import alivelock

SETSID_AND_CLEAR_ENV = (
    "import os, sys, time; os.setsid(); "
    "os.execve('/bin/sleep', ['sleep', '30'], {})"  # a new session and an empty env
)


def test_no_lock_file_means_no_evidence(tmp_path: Path) -> None:
    assert alivelock.held(tmp_path / "missing.alive") is None


def test_the_holder_itself_counts_as_alive_and_release_frees_it(tmp_path: Path) -> None:
    path = tmp_path / "t.1"
    fd = alivelock.hold(path)
    assert alivelock.held(path) is True
    alivelock.release(fd)
    assert alivelock.held(path) is False  # the heartbeat file stays, unlocked


def test_a_child_that_escaped_its_session_and_environment_keeps_it_held(tmp_path: Path) -> None:
    path = tmp_path / "t.1"
    fd = alivelock.hold(path)
    child = subprocess.Popen([sys.executable, "-c", SETSID_AND_CLEAR_ENV], pass_fds=(fd,))
    try:
        os.close(fd)  # the runner "dies": only the child holds the lock now
        assert alivelock.held(path) is True
    finally:
        child.kill()
        child.wait(timeout=10)
    assert alivelock.held(path) is False  # a dead (reaped) child holds nothing


# A child that opens the lock file itself and says so: read-write and close-on-exec (as
# the runner's own descriptor is), or read-only and inheritable (as no task holds it).
OPEN_AND_WAIT = (
    "import os, sys; fd = os.open(sys.argv[1], getattr(os, sys.argv[2])); "
    "os.set_inheritable(fd, sys.argv[3] == 'inheritable'); print('ready', flush=True); "
    "sys.stdin.read()"
)


def test_the_holder_scan_finds_the_processes_that_inherited_the_lock_only(
    tmp_path: Path,
) -> None:
    """``ferry kill`` finds an orphan that left the task's session and cleared its
    environment by the lock it inherited. Not every process with the file open is the
    task's: the runner's own descriptor is close-on-exec, ferry's probes open it
    read-only; neither may be taken for the task (and signalled)."""
    from ferry.proc.process import scan_processes

    path = tmp_path / "t.1"
    fd = alivelock.hold(path)
    heir = subprocess.Popen([sys.executable, "-c", SETSID_AND_CLEAR_ENV], pass_fds=(fd,))
    os.close(fd)
    others = [
        subprocess.Popen(
            [sys.executable, "-c", OPEN_AND_WAIT, str(path), *how],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for how in (("O_RDWR", "close-on-exec"), ("O_RDONLY", "inheritable"))
    ]
    try:
        for other in others:
            assert other.stdout is not None and other.stdout.readline() == "ready\n"
        found = {ident.pid for ident in scan_processes(None, holding=path).alive}
        assert found == {heir.pid}
        assert not scan_processes(None, holding=tmp_path / "missing").alive
    finally:
        for child in (heir, *others):
            child.kill()
            child.communicate(timeout=10)


# ---- the beat record ------------------------------------------------------------------

STEP_S = 1000.0  # a wall clock far off: an age measured on it would show


def test_a_beat_is_aged_on_the_monotonic_clock_an_old_file_by_its_mtime(tmp_path: Path) -> None:
    """The record ``hold`` and ``beat`` write is aged on CLOCK_MONOTONIC, whatever the
    wall clock says; a file without one (an older ferry's) by its mtime, as before."""
    from ferry.proc.liveness import heartbeat_age

    path = tmp_path / "t.1"
    assert heartbeat_age(path, time.time()) is None  # no file
    fd = alivelock.hold(path)
    try:
        for _ in range(2):
            age, clock = heartbeat_age(path, time.time() + STEP_S) or (None, None)
            assert clock == "monotonic" and age is not None and 0 <= age < STEP_S / 2
            alivelock.beat(path)
    finally:
        alivelock.release(fd)
    old = tmp_path / "old.1"
    old.touch()
    age, clock = heartbeat_age(old, time.time() + STEP_S) or (None, None)
    assert clock == "wall" and age is not None and age > STEP_S / 2


def test_a_suspend_of_the_machine_does_not_age_a_beat(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing runs while the machine is suspended, its supervisors included: their
    beats cannot be due then. Right after a resume CLOCK_BOOTTIME (and the wall clock)
    are a suspend further on, CLOCK_MONOTONIC is not. Aged on the boot clock, every
    running task looked stale to the first recovery pass, and ``--kill-stale`` killed
    them (found by a review, with that simulation). Beats are aged on CLOCK_MONOTONIC;
    a record of an older ferry (on the boot clock) as before."""
    from ferry.proc.liveness import heartbeat_age

    path = tmp_path / "t.1"
    fd = alivelock.hold(path)
    try:
        real = time.clock_gettime_ns
        suspended_ns = int(STEP_S * 1e9)
        monkeypatch.setattr(
            time,
            "clock_gettime_ns",
            lambda clock: real(clock) + (suspended_ns if clock == time.CLOCK_BOOTTIME else 0),
        )
        age, clock = heartbeat_age(path, time.time() + STEP_S) or (None, None)
        assert clock == "monotonic" and age is not None and 0 <= age < STEP_S / 2
        monkeypatch.undo()
        old = alivelock.parse_beat(path.read_bytes())
        assert old is not None  # (a boot-clock record, as ferry-beat/1 wrote them)
        record = alivelock.beat_record(
            alivelock.Beat(old.boot_id, old.time_namespace, real(time.CLOCK_BOOTTIME), "boot")
        )
        assert record is not None and record.startswith(b"ferry-beat/1 ")
        path.write_bytes(record)
        age, clock = heartbeat_age(path, time.time()) or (None, None)
        assert clock == "boot" and age is not None and 0 <= age < STEP_S / 2
    finally:
        alivelock.release(fd)


def sound_record(path: Path) -> bytes:
    alivelock.beat(path)
    raw = path.read_bytes()
    assert alivelock.parse_beat(raw) is not None and len(raw) == alivelock.BEAT_BYTES
    return raw


def test_a_torn_or_foreign_beat_record_falls_back_to_the_mtime(tmp_path: Path) -> None:
    """Never a crash, never an age read from garbage: a record cut anywhere (a read that
    met a write half done), with any byte changed, mixed with an earlier one, or from
    another boot or time namespace gives the mtime's age."""
    from ferry.proc.liveness import heartbeat_age
    from ferry.proc.process import boot_id, time_namespace

    path = tmp_path / "t.1"
    raw = sound_record(path)
    earlier = alivelock.beat_record(alivelock.Beat(boot_id(), time_namespace() or 0, 12345))
    assert earlier is not None
    foreign = [
        alivelock.beat_record(alivelock.Beat("another-boot", time_namespace() or 0, 1)),
        alivelock.beat_record(alivelock.Beat(boot_id(), (time_namespace() or 0) + 1, 1)),
    ]
    damaged = [raw[:cut] for cut in range(len(raw))]
    damaged += [raw[:i] + bytes([raw[i] ^ 0x20]) + raw[i + 1 :] for i in range(len(raw))]
    mixed = {raw[:cut] + earlier[cut:] for cut in range(len(raw))}  # a write half done
    damaged += sorted(mixed - {raw, earlier})
    damaged += [r for r in foreign if r is not None]
    damaged += [b"\0" * len(raw), b"x" * 4096, raw.replace(b" ", b"\t")]
    assert len(foreign) == 2 and all(foreign)
    for content in damaged:
        path.write_bytes(content)
        os.utime(path, (1.0, 1.0))  # an mtime long ago: the wall clock's age shows it
        age, clock = heartbeat_age(path, 1.0 + STEP_S) or (None, None)
        assert (clock, age) == ("wall", STEP_S), content


def test_a_beat_from_another_time_namespace_is_aged_by_its_mtime(tmp_path: Path) -> None:
    """A runner in a container with its own time namespace reads another CLOCK_BOOTTIME
    (offset by the namespace): its record's clock means nothing here. A real one."""
    path = tmp_path / "t.1"
    beat_there = f"import pathlib, ferry.proc.alivelock as a; a.beat(pathlib.Path({str(path)!r}))"
    command = ["unshare", "--time", "--boottime", "100000", "--fork", sys.executable, "-c"]
    done = subprocess.run([*command, beat_there], capture_output=True, timeout=60, check=False)
    if done.returncode != 0:
        pytest.skip(f"no time namespace here: {done.stderr.decode(errors='replace')[-200:]}")
    from ferry.proc.liveness import heartbeat_age
    from ferry.proc.process import time_namespace

    beat = alivelock.parse_beat(path.read_bytes())
    assert beat is not None and beat.time_namespace != time_namespace()
    age, clock = heartbeat_age(path, time.time()) or (None, None)
    assert clock == "wall" and age is not None and abs(age) < STEP_S  # not -100000


BEAT_AGAIN_AND_AGAIN = (
    "import pathlib, sys, ferry.proc.alivelock as a\n"
    "path = pathlib.Path(sys.argv[1])\n"
    "print('beating', flush=True)\n"
    "while True: a.beat(path)\n"
)


def test_reads_racing_a_beating_runner_give_true_ages_only(tmp_path: Path) -> None:
    """A runner beating as fast as it can, recovery reading meanwhile: every age read is
    one of a beat just written (on the boot clock) or, had a read met every write half
    done, the mtime's; never one made of two records."""
    from ferry.proc.liveness import heartbeat_age

    path = tmp_path / "t.1"
    sound_record(path)
    writer = subprocess.Popen(
        [sys.executable, "-c", BEAT_AGAIN_AND_AGAIN, str(path)], stdout=subprocess.PIPE
    )
    try:
        assert writer.stdout is not None and writer.stdout.readline() == b"beating\n"
        for _ in range(20000):
            age, clock = heartbeat_age(path, time.time()) or (None, None)
            assert age is not None and clock in ("monotonic", "wall"), (age, clock)
            assert 0 <= age < STEP_S / 2 if clock == "monotonic" else abs(age) < STEP_S / 2
    finally:
        writer.kill()
        writer.wait(timeout=10)
