"""Process identity, liveness probes, verified signals and the marker scan, on real
processes. Every child is reaped (the ``children`` fixture); waits poll with a deadline."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ferry.proc.liveness import Liveness, probe, probe_task
from ferry.proc.process import (
    MARKER_ENV,
    NotGroupLeaderError,
    ProcessIdentity,
    find_by_marker,
    identity_of,
    make_marker,
    marker_prefix,
    read_stat,
    scan_processes,
    self_identity,
    signal_task,
    signal_verified,
)

pytestmark = pytest.mark.timeout(60)

SLEEPER = "import time\nwhile True: time.sleep(1)"


def wait_until(condition: Callable[[], bool], timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met before the deadline")
        time.sleep(0.01)


def gone(pid: int) -> bool:
    """No live process with this pid (absent, or a zombie nobody reaped yet)."""
    try:
        st = read_stat(pid)
    except OSError:
        return False
    return st is None or st.exited


class Children:
    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.strays: list[ProcessIdentity] = []  # grandchildren we do not parent

    def start(
        self, code: str, *, marker: str | None = None, session: bool = True, **kw: object
    ) -> subprocess.Popen[bytes]:
        env = dict(os.environ)
        env.pop(MARKER_ENV, None)
        if marker is not None:
            env[MARKER_ENV] = marker
        proc: subprocess.Popen[bytes] = subprocess.Popen(  # type: ignore[call-overload]
            [sys.executable, "-c", code], env=env, start_new_session=session, **kw
        )
        self.procs.append(proc)
        return proc

    def cleanup(self) -> None:
        for ident in self.strays:
            signal_verified(ident, signal.SIGKILL, group=False)
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
            proc.wait(timeout=10)
            for stream in (proc.stdout, proc.stderr, proc.stdin):
                if stream is not None:
                    stream.close()
        for ident in self.strays:
            wait_until(lambda ident=ident: gone(ident.pid))  # type: ignore[misc]


@pytest.fixture
def children() -> Iterator[Children]:
    kids = Children()
    try:
        yield kids
    finally:
        kids.cleanup()


def live_identity(pid: int) -> ProcessIdentity:
    ident = identity_of(pid)
    assert ident is not None
    return ident


# --- identity ------------------------------------------------------------------------


def test_self_identity_is_alive_and_round_trips_through_json() -> None:
    me = self_identity()
    assert me.pid == os.getpid()
    assert me.start_time > 0 and me.boot_id and me.host
    assert ProcessIdentity.from_json(me.to_json()) == me
    assert probe(me) is Liveness.ALIVE


def test_identity_of_a_child_is_stable_and_distinct_from_ours(children: Children) -> None:
    child = children.start(SLEEPER)
    first = live_identity(child.pid)
    assert first == live_identity(child.pid)
    assert first.pid == child.pid and first != self_identity()
    assert first.start_time >= self_identity().start_time
    assert probe(first) is Liveness.ALIVE


def test_identity_of_a_pid_that_does_not_exist_is_none(children: Children) -> None:
    child = children.start("pass")
    child.wait()
    assert identity_of(child.pid) is None


# --- DEAD only with proof -------------------------------------------------------------


def test_a_dead_reaped_child_is_dead(children: Children) -> None:
    child = children.start(SLEEPER)
    ident = live_identity(child.pid)
    child.kill()
    child.wait()
    assert probe(ident) is Liveness.DEAD


def test_a_zombie_is_not_alive(children: Children) -> None:
    child = children.start("pass")
    ident = live_identity(child.pid)
    # Not reaped: it stays a zombie until cleanup waits for it.
    wait_until(lambda: (st := read_stat(child.pid)) is not None and st.exited)
    assert probe(ident) is Liveness.DEAD
    assert signal_verified(ident, signal.SIGTERM, group=False) is False


def test_pid_reuse_is_dead_and_never_signalled(children: Children) -> None:
    # A recorded identity whose pid now belongs to another process: simulated with a
    # live process and the wrong start time (what a reused pid looks like).
    victim = children.start(SLEEPER)
    real = live_identity(victim.pid)
    recorded = ProcessIdentity(real.pid, real.start_time - 1, real.boot_id, real.host)
    assert probe(recorded) is Liveness.DEAD
    assert probe_task("no-such-task:1:x", recorded) is Liveness.DEAD
    for sig in (signal.SIGKILL, signal.SIGTERM):
        assert signal_verified(recorded, sig, group=False) is False
        assert signal_verified(recorded, sig, group=True) is False
    assert signal_task(recorded, "no-such-task:1:x", signal.SIGKILL) == 0
    assert victim.poll() is None, "the unrelated process must survive"
    assert probe(real) is Liveness.ALIVE


def test_another_boot_is_dead(children: Children) -> None:
    victim = children.start(SLEEPER)
    real = live_identity(victim.pid)
    old_boot = ProcessIdentity(real.pid, real.start_time, "another-boot", real.host)
    assert probe(old_boot) is Liveness.DEAD
    assert signal_verified(old_boot, signal.SIGKILL, group=False) is False
    assert victim.poll() is None


def test_host_name_alone_does_not_decide(children: Children) -> None:
    # The hostname can change without a reboot; the boot id is what decides.
    victim = children.start(SLEEPER)
    real = live_identity(victim.pid)
    renamed = ProcessIdentity(real.pid, real.start_time, real.boot_id, "renamed-host")
    assert probe(renamed) is Liveness.ALIVE


# --- verified signals ----------------------------------------------------------------


def test_signal_verified_reaches_the_process(children: Children) -> None:
    child = children.start(SLEEPER)
    ident = live_identity(child.pid)
    assert signal_verified(ident, signal.SIGTERM, group=False) is True
    assert child.wait(timeout=10) == -signal.SIGTERM
    assert signal_verified(ident, signal.SIGTERM, group=False) is False


def test_group_signal_reaches_every_member(children: Children, tmp_path: Path) -> None:
    pid_file = tmp_path / "member.pid"
    code = (
        "import os, subprocess, sys, time\n"
        f"p = subprocess.Popen([sys.executable, '-c', {SLEEPER!r}])\n"
        f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
        "p.wait()\n"
    )
    leader = children.start(code)
    wait_until(lambda: pid_file.exists() and pid_file.read_text() != "")
    member = live_identity(int(pid_file.read_text()))
    children.strays.append(member)
    assert signal_verified(live_identity(leader.pid), signal.SIGKILL, group=True) is True
    assert leader.wait(timeout=10) == -signal.SIGKILL
    wait_until(lambda: probe(member) is Liveness.DEAD)


def test_group_signal_refuses_a_process_that_leads_no_group(children: Children) -> None:
    child = children.start(SLEEPER, session=False)  # stays in our process group
    with pytest.raises(NotGroupLeaderError):
        signal_verified(live_identity(child.pid), signal.SIGTERM, group=True)
    assert child.poll() is None


# --- markers, sessions, escaped children ------------------------------------------------


def spawn_escaping_grandchild(
    children: Children, tmp_path: Path, marker: str
) -> tuple[subprocess.Popen[bytes], ProcessIdentity]:
    """A task whose first process forks a daemon that calls setsid, then exits."""
    pid_file = tmp_path / "daemon.pid"
    code = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        f"    open({str(pid_file)!r} + '.tmp', 'w').write(str(os.getpid()))\n"
        f"    os.rename({str(pid_file)!r} + '.tmp', {str(pid_file)!r})\n"
        "    while True: time.sleep(1)\n"
        "os._exit(0)\n"
    )
    first = children.start(code, marker=marker)
    wait_until(pid_file.exists)
    daemon = live_identity(int(pid_file.read_text()))
    children.strays.append(daemon)
    return first, daemon


def test_marker_scan_finds_a_grandchild_that_called_setsid(
    children: Children, tmp_path: Path
) -> None:
    marker = make_marker("T0MARK", 1, "tok1")
    first, daemon = spawn_escaping_grandchild(children, tmp_path, marker)
    leader = live_identity(first.pid)
    first.wait(timeout=10)
    assert probe(leader) is Liveness.DEAD
    scan = find_by_marker(marker_prefix("T0MARK"))
    assert daemon in scan.alive
    assert scan.complete
    assert find_by_marker(marker_prefix("T0MARK", 2)).alive == ()
    assert find_by_marker(marker_prefix("T0MAR")).alive == (), "prefixes end at ':'"
    assert daemon in find_by_marker(marker).alive
    assert find_by_marker(marker[:-1]).alive == (), "a whole marker matches only itself"
    # The task is alive although its first process is gone; unknown leader too.
    assert probe_task(marker, leader) is Liveness.ALIVE
    assert probe_task(marker, None) is Liveness.ALIVE
    # Cancel reaches it, and then the task is dead.
    assert signal_task(leader, marker, signal.SIGKILL) == 1
    wait_until(lambda: probe(daemon) is Liveness.DEAD)
    assert probe_task(marker, leader) is Liveness.DEAD


def leader_gone_leaving(
    children: Children, tmp_path: Path, marker: str, envs: list[dict[str, str] | None]
) -> tuple[ProcessIdentity, list[ProcessIdentity]]:
    """A task's leader that starts a sleeper per environment of ``envs`` (None: its
    own, the task's marker in it; ``{}``: cleared) in its session, then exits, reaped:
    the leader's identity and the sleepers'."""
    pid_file = tmp_path / "children.pid"
    code = (
        "import os, subprocess, sys\n"
        f"kids = [subprocess.Popen([sys.executable, '-c', {SLEEPER!r}], env=env)"
        f" for env in {envs!r}]\n"
        f"open({str(pid_file)!r} + '.tmp', 'w').write(' '.join(str(k.pid) for k in kids))\n"
        f"os.rename({str(pid_file)!r} + '.tmp', {str(pid_file)!r})\n"
        "os._exit(0)\n"
    )
    first = children.start(code, marker=marker)
    leader = live_identity(first.pid)
    first.wait(timeout=10)
    wait_until(pid_file.exists)
    kids = [live_identity(int(pid)) for pid in pid_file.read_text().split()]
    children.strays += kids
    return leader, kids


def test_a_member_found_only_by_the_id_of_a_leader_gone_is_unknown_and_never_signalled(
    children: Children, tmp_path: Path
) -> None:
    """The child keeps the session but clears its environment: only the session shows
    it. With its leader gone, the session's number proves nothing: no process holds it
    as its pid, so it may have been freed (the task's processes all dead) and taken by
    an unrelated program's session (a review: everything of a task killed at once, its
    leader's pid reused by a program that daemonized the classic way, fork, setsid,
    fork; ``ferry kill`` and ``ferry cancel`` SIGKILLed that daemon). Such a member is
    unknown (recovery quarantines, never requeues), and is never signalled; one that
    carries the task's marker or holds its alive-lock is the task's."""
    marker = make_marker("T0SESS", 1, "tok")
    leader, (orphan,) = leader_gone_leaving(children, tmp_path, marker, [{}])
    assert find_by_marker(marker).alive == ()
    scan = scan_processes(marker, session_of=leader)
    assert scan.alive == () and scan.unproven == (orphan,) and not scan.complete
    assert probe_task(marker, leader) is Liveness.UNKNOWN
    assert signal_task(leader, marker, signal.SIGKILL) == 0
    assert probe(orphan) is Liveness.ALIVE


def test_a_member_in_the_session_of_a_proven_process_of_the_task_is_the_task_s(
    children: Children, tmp_path: Path
) -> None:
    """The same child, beside a sibling that carries the task's marker in the same
    session: the number is held by a process of the task (the kernel never reuses a
    number while a process has it as its session or group id), so the child is the
    task's too. It was left unproven, and ``cancel`` killed the marked sibling only,
    then sent the user to a ``kill`` that refused (a review)."""
    marker = make_marker("T0SIBS", 1, "tok")
    leader, (marked, bare) = leader_gone_leaving(children, tmp_path, marker, [None, {}])
    scan = scan_processes(marker, session_of=leader)
    assert set(scan.alive) == {marked, bare} and scan.unproven == () and scan.complete
    assert probe_task(marker, leader) is Liveness.ALIVE
    assert signal_task(leader, marker, signal.SIGKILL) == 2
    wait_until(lambda: probe(marked) is Liveness.DEAD and probe(bare) is Liveness.DEAD)


def test_a_finished_task_is_dead(children: Children) -> None:
    marker = make_marker("T0DONE", 1, "tok")
    first = children.start("pass", marker=marker)
    leader = live_identity(first.pid)
    first.wait(timeout=10)
    assert probe_task(marker, leader) is Liveness.DEAD
    assert probe_task(marker, None) is Liveness.DEAD


def spawn_leader_with_member(
    children: Children, marker: str | None = None
) -> tuple[subprocess.Popen[bytes], ProcessIdentity]:
    """A session leader that starts one member of its group, reports its pid, and exits
    (left unreaped: a zombie leader) or stays, as the test decides."""
    code = (
        "import os, subprocess, sys\n"
        f"p = subprocess.Popen([sys.executable, '-c', {SLEEPER!r}])\n"
        "sys.stdout.write(str(p.pid) + '\\n'); sys.stdout.flush()\n"
        "sys.stdin.read()\n"
    )
    leader = children.start(code, marker=marker, stdout=subprocess.PIPE, stdin=subprocess.PIPE)
    assert leader.stdout is not None
    member = live_identity(int(leader.stdout.readline()))
    children.strays.append(member)
    return leader, member


def test_a_group_signal_through_a_zombie_leader_reaches_the_members(children: Children) -> None:
    leader, member = spawn_leader_with_member(children)
    ident = live_identity(leader.pid)
    assert leader.stdin is not None
    leader.stdin.close()  # the leader exits; we do not reap it yet: a zombie
    wait_until(lambda: (st := read_stat(leader.pid)) is not None and st.exited)
    assert probe(ident) is Liveness.DEAD
    assert probe_task("T0ZOMB:1:x", ident) is Liveness.ALIVE, "its group lives on"
    assert signal_verified(ident, signal.SIGKILL, group=True) is True
    wait_until(lambda: probe(member) is Liveness.DEAD)
    assert probe_task("T0ZOMB:1:x", ident) is Liveness.DEAD


def test_signal_task_signals_a_group_member_once(children: Children) -> None:
    marker = make_marker("T0ONCE", 1, "tok")
    leader, member = spawn_leader_with_member(children, marker)
    # The member is in the leader's group, its session, and carries the marker: it is
    # reached through the group, and not signalled a second time on its own. (Its
    # parent learns of the exec a moment before the kernel shows the new environment:
    # wait for the marker to show.)
    wait_until(lambda: member in find_by_marker(marker).alive)
    assert signal_task(live_identity(leader.pid), marker, signal.SIGKILL) == 1
    assert leader.wait(timeout=10) == -signal.SIGKILL
    wait_until(lambda: probe(member) is Liveness.DEAD)


def test_signal_task_signals_a_leader_recorded_without_namespaces_once(
    children: Children,
) -> None:
    """A leader that leads no group (signalled alone) and carries the marker, as an older
    journal records it (no pid_ns, time_ns): the scan finds it under its full identity,
    and must know it for the leader already signalled."""
    marker = make_marker("T0OLDREC", 1, "tok")
    child = children.start(SLEEPER, marker=marker, session=False)
    wait_until(lambda: any(i.pid == child.pid for i in find_by_marker(marker).alive))
    now = live_identity(child.pid)
    recorded = ProcessIdentity(now.pid, now.start_time, now.boot_id, now.host)
    assert signal_task(recorded, marker, signal.SIGCONT) == 1


SIGNALLER = """
import sys
from ferry.proc.process import ProcessIdentity, signal_verified
import json, signal
ident = ProcessIdentity.from_json(json.loads(sys.argv[1]))
print("signalling", flush=True)
print("sent", signal_verified(ident, signal.SIGTERM, group=False), flush=True)
"""


@pytest.mark.parametrize("point", ["before:signal", "after:signal"])
def test_signal_failpoints_crash_on_the_right_side_of_the_send(
    children: Children, point: str
) -> None:
    victim = children.start(SLEEPER)
    ident = live_identity(victim.pid)
    env = {**os.environ, "FERRY_FAILPOINTS": point}
    result = subprocess.run(
        [sys.executable, "-c", SIGNALLER, json.dumps(ident.to_json())],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == -signal.SIGKILL
    assert result.stdout == "signalling\n"
    if point == "before:signal":
        assert victim.poll() is None and probe(ident) is Liveness.ALIVE
    else:
        assert victim.wait(timeout=10) == -signal.SIGTERM


# --- PID namespaces (real ones: ``unshare``, as root or with user namespaces) ----------

IN_A_CONTAINER = ("unshare", "--pid", "--fork", "--mount-proc", "--kill-child")
# Inside: say who I am (pid 1 there), note SIGUSR1 (an init ignores signals it does not
# handle), then wait.
SAY_WHO_AND_WAIT = (
    "import json, os, signal, sys\n"
    "from ferry.proc.process import self_identity\n"
    "signal.signal(signal.SIGUSR1, lambda *_: os.write(1, b'got SIGUSR1\\n'))\n"
    "print(json.dumps(self_identity().to_json()), flush=True)\n"
    "while True: signal.pause()\n"
)
PROBE_THESE = (
    "import json, sys\n"
    "from ferry.proc.liveness import probe\n"
    "from ferry.proc.process import ProcessIdentity\n"
    "print(json.dumps([probe(ProcessIdentity.from_json(i)).value"
    " for i in json.loads(sys.argv[1])]))\n"
)


def in_a_container(children: Children, code: str, *args: str) -> subprocess.Popen[bytes]:
    """``code`` run by python as pid 1 of a new PID namespace with its own /proc."""
    done = subprocess.run([*IN_A_CONTAINER, "true"], capture_output=True, timeout=60)
    if done.returncode != 0:
        pytest.skip(f"no PID namespace can be made here: {done.stderr.decode()[-200:]!r}")
    proc: subprocess.Popen[bytes] = subprocess.Popen(
        [*IN_A_CONTAINER, sys.executable, "-c", code, *args], stdout=subprocess.PIPE
    )
    children.procs.append(proc)
    return proc


def test_a_process_of_a_nested_pid_namespace_is_probed_and_signalled_by_translation(
    children: Children,
) -> None:
    """Its identity says pid 1 of its namespace; here (the host) pid 1 is init. Probes
    and signals go to the pid it has here (NSpid), never to our pid 1; once it is gone,
    nothing proves where the number went: UNKNOWN, not DEAD."""
    inside = in_a_container(children, SAY_WHO_AND_WAIT)
    assert inside.stdout is not None
    there = ProcessIdentity.from_json(json.loads(inside.stdout.readline()))
    assert there.pid == 1 and there.pid_ns not in (None, self_identity().pid_ns)
    assert probe(there) is Liveness.ALIVE
    init = identity_of(1)
    assert init is not None and init.start_time != there.start_time  # a DEAD, before
    assert signal_verified(there, signal.SIGUSR1, group=False) is True
    assert inside.stdout.readline() == b"got SIGUSR1\n"
    assert signal_verified(there, signal.SIGKILL, group=False) is True
    inside.wait(timeout=10)
    wait_until(lambda: probe(there) is not Liveness.ALIVE)
    assert probe(there) is Liveness.UNKNOWN
    assert signal_verified(there, signal.SIGKILL, group=False) is False


def test_from_inside_a_container_the_host_s_processes_are_unknown(children: Children) -> None:
    """The other way: a ferry in a container cannot see the host's PID namespace, so it
    can neither prove a host process alive nor dead; by the number alone (a record
    without its namespace, as older journals hold) it judges as before: here, DEAD,
    wrongly (pid 1 inside is another process; our pid does not exist there)."""
    host = [self_identity(), live_identity(1)]
    for recorded, expected in (
        ([i.to_json() for i in host], ["UNKNOWN", "UNKNOWN"]),
        ([ProcessIdentity(i.pid, i.start_time, i.boot_id, i.host).to_json() for i in host],
         ["DEAD", "DEAD"]),
    ):  # fmt: skip
        inside = in_a_container(children, PROBE_THESE, json.dumps(recorded))
        out, _ = inside.communicate(timeout=60)
        assert json.loads(out) == expected


def test_a_pid_whose_namespace_cannot_be_seen_is_never_signalled(children: Children) -> None:
    """Our own child, recorded as in a PID namespace no process here is in: the same
    number and start time, yet not provably the same process. UNKNOWN, never
    signalled (neither alone nor as a group, nor as a task's leader)."""
    child = children.start(SLEEPER)
    real = live_identity(child.pid)
    elsewhere = ProcessIdentity(real.pid, real.start_time, real.boot_id, real.host, 1)
    assert probe(elsewhere) is Liveness.UNKNOWN
    assert probe_task("no-such-task:1:x", elsewhere) is Liveness.UNKNOWN
    for sig in (signal.SIGKILL, signal.SIGTERM):
        assert signal_verified(elsewhere, sig, group=False) is False
        assert signal_verified(elsewhere, sig, group=True) is False
    assert signal_task(elsewhere, "no-such-task:1:x", signal.SIGKILL) == 0
    assert child.poll() is None
    assert probe(real) is Liveness.ALIVE


IN_A_TIME_NAMESPACE = ("unshare", "--time", "--boottime", "100000", "--fork", "--kill-child")


def test_a_process_of_another_time_namespace_is_unknown_while_it_lives(
    children: Children,
) -> None:
    """Its start time, read in its time namespace, is offset by 100000 s from the one we
    read: a difference that proves no pid reuse. UNKNOWN while the pid is used, never
    signalled on that identity (the marker scan, which reads start times here, still
    finds and names it); DEAD once no process has the pid."""
    done = subprocess.run([*IN_A_TIME_NAMESPACE, "true"], capture_output=True, timeout=60)
    if done.returncode != 0:
        pytest.skip(f"no time namespace can be made here: {done.stderr.decode()[-200:]!r}")
    marker = make_marker("TIMENS", 1, "tok")
    env = {**os.environ, MARKER_ENV: marker}
    inside = subprocess.Popen(
        [*IN_A_TIME_NAMESPACE, sys.executable, "-c", SAY_WHO_AND_WAIT],
        stdout=subprocess.PIPE,
        env=env,
    )
    children.procs.append(inside)
    assert inside.stdout is not None
    there = ProcessIdentity.from_json(json.loads(inside.stdout.readline()))
    here = live_identity(there.pid)
    assert there.time_ns != here.time_ns and there.start_time - here.start_time >= 100000 * 99
    assert probe(there) is Liveness.UNKNOWN and probe(here) is Liveness.ALIVE
    assert probe_task(marker, there) is Liveness.ALIVE  # the marker scan: its pid here
    assert here in find_by_marker(marker).alive  # (with unshare, its parent)
    for sig in (signal.SIGKILL, signal.SIGTERM):
        assert signal_verified(there, sig, group=False) is False
    assert inside.poll() is None
    os.kill(there.pid, signal.SIGKILL)  # (the test's own child's child: by number)
    inside.wait(timeout=10)
    wait_until(lambda: probe(there) is Liveness.DEAD)
    assert probe_task(marker, there) is Liveness.DEAD
