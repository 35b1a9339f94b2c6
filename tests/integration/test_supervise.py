"""ferry.proc.supervise with real processes: exit status, spawn failures, signals reaching the
whole tree, timeouts, grace and SIGKILL, byte-exact capture, heartbeats, leftovers.

Children are ``sys.executable -c`` scripts. Tests that must signal the supervisor or
capture its fd 1 run it in a subprocess (supervise_driver.py). No fixed sleeps: every
wait polls a condition with a deadline; readiness is handed over through files, often
from ``on_spawned`` (called before the loop starts, so a timeout of 0 fires only once
the tree is ready).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import resource
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
import tty
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hardkit import wait_for
from taskscripts import TREE_LEAF

from ferry.proc._outputs import LogFile, SignalTrap
from ferry.proc._sink import ECHO_BACKLOG_BYTES, Echo, Sink, echoes
from ferry.proc._taskloop import TaskLoop
from ferry.proc.supervise import Outcome, SpawnFailed, SuperviseSpec, supervise

PY = sys.executable
DRIVER = Path(__file__).with_name("supervise_driver.py")
DEADLINE_S = 20.0


# Starts TREE_LEAF as its child (same process group) and waits for it.
# (SIGHUP to its default: under nohup the test runner's SIG_IGN would be inherited.)
TREE_ROOT = r"""
import signal, subprocess, sys
signal.signal(signal.SIGHUP, signal.SIG_DFL)
leaf = subprocess.Popen([sys.executable, "-c", sys.argv[1], *sys.argv[2:]])
sys.exit(leaf.wait())
"""

# Ignores SIGTERM (writing argv[1] each time one arrives), then reports ready in argv[2].
STUBBORN = r"""
import os, signal, sys, time
marker, ready = sys.argv[1], sys.argv[2]
def on(sig, frame):
    with open(marker, "a") as f:
        f.write("TERM\n")
signal.signal(signal.SIGTERM, on)
with open(ready, "w") as f:
    f.write(str(os.getpid()))
while True:
    time.sleep(60)
"""

SILENT = "import time\nwhile True: time.sleep(60)"


def live_members(pgid: int) -> list[int]:
    """Pids of processes in group ``pgid`` that have not exited (zombies excluded)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            raw = Path(f"/proc/{name}/stat").read_bytes()
        except OSError:
            continue
        fields = raw[raw.rfind(b")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            found.append(int(name))
    return found


def group_absent(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def assert_group_gone(pgid: int) -> None:
    """The contract: on return no member of the group is alive (exited members may
    still wait, as zombies, for init to reap them)."""
    assert live_members(pgid) == []


def assert_group_vanishes(pgid: int) -> None:
    """Once init has reaped the zombies, the group does not exist at all (init here
    may take a second or two: that wait is why only a few tests check this)."""
    assert_group_gone(pgid)
    wait_for(lambda: group_absent(pgid), f"group {pgid} to vanish (zombies reaped)")


def make_spec(tmp_path: Path, argv: list[str] | None = None, **overrides: Any) -> SuperviseSpec:
    fields: dict[str, Any] = {
        "argv": argv,
        "cwd": str(tmp_path),
        "env": dict(os.environ),
        "timeout_s": None,
        "kill_grace_s": 5.0,
        "heartbeat_s": 1.0,
        "stdout_log": tmp_path / "task.out",
        "stderr_log": tmp_path / "task.err",
        "heartbeat_path": tmp_path / "task.hb",
        "passthrough": False,
    }
    fields.update(overrides)
    return SuperviseSpec(**fields)


def run(spec: SuperviseSpec, **kwargs: Any) -> Outcome:
    kwargs.setdefault("on_spawned", lambda pid, pgid: None)
    outcome = supervise(spec, **kwargs)
    assert_group_gone(outcome.pgid)
    return outcome


@pytest.fixture(params=["pidfd-group", "pidfd-killpg", "no-pidfd"])
def process_api(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The three ways the supervisor can name the group: a pidfd with group signals
    (Linux 6.9+), a pidfd with killpg (older kernels answer EINVAL), no pidfd at all."""
    mode: str = request.param
    if mode == "pidfd-killpg":
        real = signal.pidfd_send_signal

        def old_kernel(pidfd: int, sig: int, siginfo: None = None, flags: int = 0) -> None:
            if flags:
                raise OSError(errno.EINVAL, "Invalid argument")
            real(pidfd, sig, siginfo, flags)

        monkeypatch.setattr(signal, "pidfd_send_signal", old_kernel)
    elif mode == "no-pidfd":
        monkeypatch.delattr(os, "pidfd_open")
    return mode


def ready_waiter(path: Path) -> Callable[[int, int], None]:
    """An on_spawned that returns once ``path`` exists (the tree is set up)."""

    def on_spawned(pid: int, pgid: int) -> None:
        wait_for(path.exists, f"{path.name} from the task")

    return on_spawned


# -- exit status -------------------------------------------------------------------------


@pytest.mark.parametrize("code", [0, 1, 42])
def test_exit_code_passes_through(tmp_path: Path, process_api: str, code: int) -> None:
    outcome = run(make_spec(tmp_path, [PY, "-c", f"import sys; sys.exit({code})"]))
    assert (outcome.exit_code, outcome.signal) == (code, None)
    assert not outcome.timed_out and not outcome.killed_after_grace
    assert not outcome.leftover_killed and outcome.forwarded_signal is None
    assert outcome.pid == outcome.pgid
    assert outcome.started_at <= outcome.ended_at


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGUSR1, signal.SIGSEGV])
def test_death_by_signal_reports_the_signal(tmp_path: Path, process_api: str, signum: int) -> None:
    script = f"import os; os.kill(os.getpid(), {int(signum)})"
    outcome = run(make_spec(tmp_path, [PY, "-c", script]))
    assert (outcome.exit_code, outcome.signal) == (None, signum)


def test_on_running_is_called_once_while_the_leader_still_runs(
    tmp_path: Path, process_api: str
) -> None:
    seen: list[bool] = []
    flag = tmp_path / "asked"

    def on_running() -> None:
        seen.append(flag.exists())  # the task is still waiting for this file
        flag.touch()

    script = f"import os, time\nwhile not os.path.exists({str(flag)!r}): time.sleep(0.01)"
    outcome = run(make_spec(tmp_path, [PY, "-c", script]), on_running=on_running,
                  running_after_s=0.05)  # fmt: skip
    assert seen == [False] and outcome.exit_code == 0


def test_on_running_is_never_called_for_a_leader_that_exited_sooner(tmp_path: Path) -> None:
    called: list[int] = []
    outcome = run(make_spec(tmp_path, ["true"]), on_running=lambda: called.append(1),
                  running_after_s=30.0)  # fmt: skip
    assert called == [] and outcome.exit_code == 0


def test_on_running_raising_kills_the_group_and_reraises(tmp_path: Path) -> None:
    def on_running() -> None:
        raise RuntimeError("journal refused SPAWNED")

    pids: list[int] = []
    with pytest.raises(RuntimeError, match="refused"):
        supervise(make_spec(tmp_path, ["sleep", "300"]), on_spawned=lambda p, g: pids.append(p),
                  on_running=on_running, running_after_s=0.01)  # fmt: skip
    assert_group_gone(pids[0])


def test_on_spawned_gets_the_pid_of_a_new_session_leader(tmp_path: Path) -> None:
    seen: list[tuple[int, int, int, int]] = []

    def on_spawned(pid: int, pgid: int) -> None:
        seen.append((pid, pgid, os.getpgid(pid), os.getsid(pid)))

    outcome = run(make_spec(tmp_path, [PY, "-c", "pass"]), on_spawned=on_spawned)
    pid = outcome.pid
    assert seen == [(pid, pid, pid, pid)]
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # already reaped


# -- spawn failures ------------------------------------------------------------------------


def test_command_not_found_is_not_found(tmp_path: Path) -> None:
    for argv0 in ("ferry-no-such-command-xyz", str(tmp_path / "missing")):
        with pytest.raises(SpawnFailed) as info:
            supervise(make_spec(tmp_path, [argv0]), on_spawned=lambda pid, pgid: None)
        assert info.value.kind == "not_found"
        assert info.value.exit_code == 127
        assert info.value.code == "spawn.not_found"


def test_file_without_exec_bit_is_not_executable(tmp_path: Path) -> None:
    script = tmp_path / "script.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o644)
    with pytest.raises(SpawnFailed) as info:
        supervise(make_spec(tmp_path, [str(script)]), on_spawned=lambda pid, pgid: None)
    assert (info.value.kind, info.value.exit_code) == ("not_executable", 126)


def test_directory_is_not_executable(tmp_path: Path) -> None:
    with pytest.raises(SpawnFailed) as info:
        supervise(make_spec(tmp_path, [str(tmp_path)]), on_spawned=lambda pid, pgid: None)
    assert (info.value.kind, info.value.exit_code) == ("not_executable", 126)


def test_missing_cwd_is_a_ferry_failure_not_command_not_found(tmp_path: Path) -> None:
    spec = make_spec(tmp_path, [PY, "-c", "pass"], cwd=str(tmp_path / "nowhere"))
    with pytest.raises(SpawnFailed) as info:
        supervise(spec, on_spawned=lambda pid, pgid: None)
    assert (info.value.kind, info.value.exit_code) == ("other", 125)


def test_the_program_is_found_in_the_task_s_path_in_order(tmp_path: Path) -> None:
    """As ``subprocess`` finds it: in the PATH of the task's environment (not the
    supervisor's), each place in turn; a place where the name is not executable is
    passed over for a later one that is, and named only when none starts."""
    first, second = tmp_path / "first", tmp_path / "second"
    for where in (first, second):
        where.mkdir()
    (first / "ferry-probe").write_text("#!/bin/sh\necho first\n")  # not executable
    (second / "ferry-probe").write_text("#!/bin/sh\necho second\n")
    (second / "ferry-probe").chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path / 'none'}:{first}:{second}"}
    run(make_spec(tmp_path, ["ferry-probe"], env=env))
    assert (tmp_path / "task.out").read_bytes() == b"second\n"
    (second / "ferry-probe").unlink()
    with pytest.raises(SpawnFailed) as info:
        supervise(make_spec(tmp_path, ["ferry-probe"], env=env), on_spawned=lambda p, g: None)
    assert (info.value.kind, info.value.exit_code) == ("not_executable", 126)


def test_a_place_on_path_where_the_name_does_not_start_is_passed_over(tmp_path: Path) -> None:
    """As ``subprocess`` (and ``execvpe``) did: each place is tried with an exec, and one
    where the name exists and looks executable but does not start (its interpreter
    missing: ENOENT; no ``#!``: ENOEXEC) is passed over for a later one that starts;
    when none does, the first such error is the one reported (126 for ENOEXEC)."""
    heads = {
        "no-interpreter": "#!/nonexistent/ferry-interp\n",
        "no-shebang": "",
        "good": "#!/bin/sh\n",
    }
    places = [tmp_path / name for name in heads]
    for where, head in zip(places, heads.values(), strict=True):
        where.mkdir()
        (where / "ferry-probe").write_text(head + "echo started\n")
        (where / "ferry-probe").chmod(0o755)
    env = {**os.environ, "PATH": ":".join(map(str, places))}
    run(make_spec(tmp_path, ["ferry-probe"], env=env))
    assert (tmp_path / "task.out").read_bytes() == b"started\n"
    (places[2] / "ferry-probe").unlink()
    with pytest.raises(SpawnFailed) as info:
        supervise(make_spec(tmp_path, ["ferry-probe"], env=env), on_spawned=lambda p, g: None)
    assert (info.value.kind, info.value.errno) == ("not_executable", errno.ENOEXEC)


# The spawning process's own directory is one it may search but not read (0311); it
# spawns a task elsewhere and prints where it is afterwards.
SPAWN_FROM_AN_UNREADABLE_CWD = r"""
import os, sys
from pathlib import Path
from ferry.proc.supervise import SuperviseSpec, supervise
task_cwd, logs = sys.argv[1], Path(sys.argv[2])
spec = SuperviseSpec(
    argv=["true"], cwd=task_cwd, env=dict(os.environ), timeout_s=None, kill_grace_s=5.0,
    heartbeat_s=1.0, stdout_log=logs / "task.out", stderr_log=logs / "task.err",
    heartbeat_path=logs / "task.hb", passthrough=False,
)
outcome = supervise(spec, on_spawned=lambda pid, pgid: None)
print(outcome.exit_code, os.getcwd())
"""


@pytest.mark.timeout(60)
def test_the_spawner_goes_back_to_a_directory_it_cannot_read(tmp_path: Path) -> None:
    """Entered for the spawn and left: the supervisor does not stay in the task's
    directory (``work``'s, reused, would hold it) when its own cannot be read."""
    prefix: list[str] = []
    if os.geteuid() == 0:  # (root reads any directory: without those capabilities)
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("needs setpriv to drop root's CAP_DAC_* (util-linux)")
        caps = "-dac_read_search,-dac_override"
        prefix = [setpriv, f"--inh-caps={caps}", f"--ambient-caps={caps}", f"--bounding-set={caps}"]
        if subprocess.run([*prefix, "true"], capture_output=True).returncode != 0:
            pytest.skip("setpriv cannot drop CAP_DAC_* here (no CAP_SETPCAP)")
    own, task = tmp_path / "own", tmp_path / "task"
    own.mkdir()
    task.mkdir()
    own.chmod(0o311)
    try:
        result = subprocess.run(
            [*prefix, PY, "-c", SPAWN_FROM_AN_UNREADABLE_CWD, str(task), str(tmp_path)],
            cwd=own, capture_output=True, text=True, timeout=DEADLINE_S,
        )  # fmt: skip
    finally:
        own.chmod(0o755)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["0", str(own)]


def test_a_relative_program_is_found_from_the_task_s_cwd(tmp_path: Path) -> None:
    here = os.getcwd()
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "hello").write_text("#!/bin/sh\npwd\n")
    (tmp_path / "bin" / "hello").chmod(0o755)
    run(make_spec(tmp_path, ["bin/hello"]))
    assert (tmp_path / "task.out").read_bytes() == str(tmp_path).encode() + b"\n"
    assert os.getcwd() == here  # (the spawning process is back where it was)


def test_the_task_inherits_only_its_standard_descriptors_and_pass_fds(tmp_path: Path) -> None:
    """A descriptor open in the spawning process without close-on-exec is not the
    task's (``close_fds``), the one in ``pass_fds`` is; SIGPIPE, which Python ignores,
    is at its default in the task (an ignored signal stays ignored across an exec)."""
    stray = os.open(os.devnull, os.O_RDONLY)
    passed = os.open(os.devnull, os.O_RDONLY)
    os.set_inheritable(stray, True)
    try:
        script = "ls /proc/$$/fd; grep SigIgn /proc/$$/status"
        run(make_spec(tmp_path, ["sh", "-c", script], pass_fds=(passed,)))
        assert os.get_inheritable(stray) and not os.get_inheritable(passed)
    finally:
        os.close(stray)
        os.close(passed)
    lines = (tmp_path / "task.out").read_text().split()
    fds = {int(line) for line in lines if line.isdigit()}
    assert passed in fds and stray not in fds and {0, 1, 2} <= fds
    ignored = int(lines[lines.index("SigIgn:") + 1], 16)
    assert not ignored & (1 << (signal.SIGPIPE - 1))


def test_a_stray_descriptor_above_the_descriptor_limit_is_not_the_task_s(tmp_path: Path) -> None:
    """A descriptor ferry's caller left open without close-on-exec, numbered above the
    soft RLIMIT_NOFILE (lowered since it was opened: ``exec 300<file; ulimit -n 100``):
    ``close_fds`` closed it; a ``posix_spawn`` close action refuses it (EBADF), and no
    task could start (125)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lowered = max(int(name) for name in os.listdir("/proc/self/fd")) + 64
    high = lowered + 10
    if hard != resource.RLIM_INFINITY and high >= hard:
        pytest.skip(f"the hard descriptor limit {hard} is too low")
    opened = os.open(os.devnull, os.O_RDONLY)
    stray = os.dup2(opened, high, inheritable=True)
    os.close(opened)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (lowered, hard))
        try:
            run(make_spec(tmp_path, ["sh", "-c", "ls /proc/$$/fd"]))
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        assert os.get_inheritable(stray)
    finally:
        os.close(stray)
    fds = {int(line) for line in (tmp_path / "task.out").read_text().split()}
    assert stray not in fds and {0, 1, 2} <= fds


def test_spawn_failure_does_not_call_on_spawned(tmp_path: Path) -> None:
    called: list[int] = []
    with pytest.raises(SpawnFailed):
        supervise(
            make_spec(tmp_path, ["ferry-no-such-command-xyz"]),
            on_spawned=lambda p, g: called.append(p),
        )
    assert called == []


def test_log_path_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_bytes(b"")
    (tmp_path / "task.out").symlink_to(target)
    with pytest.raises(SpawnFailed) as info:
        supervise(make_spec(tmp_path, [PY, "-c", "print(1)"]), on_spawned=lambda p, g: None)
    assert info.value.kind == "other"
    assert target.read_bytes() == b""


# -- the command line and the environment -------------------------------------------------


def test_argv_is_exact_without_a_shell(tmp_path: Path) -> None:
    argv = [PY, "-c", "import sys; sys.stdout.write(repr(sys.argv[1:]))", "$HOME", "a b", "*"]
    run(make_spec(tmp_path, argv))
    assert (tmp_path / "task.out").read_text() == repr(["$HOME", "a b", "*"])


def test_shell_runs_argv0_through_sh(tmp_path: Path) -> None:
    run(make_spec(tmp_path, ['echo "$0-$1" | tr a-z A-Z', "x", "y"], shell=True))
    assert (tmp_path / "task.out").read_text() == "X-Y\n"


def test_child_environment_is_exactly_the_spec_env(tmp_path: Path) -> None:
    env = {"FERRY_TASK": "t1:1:tok", "PATH": os.environ["PATH"], "ODD": "a=b c"}
    run(make_spec(tmp_path, ["/usr/bin/env"], env=env))
    lines = (tmp_path / "task.out").read_text().splitlines()
    assert sorted(lines) == sorted(f"{k}={v}" for k, v in env.items())


def test_a_task_started_is_supervised_even_if_the_spawner_cannot_go_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its own directory made unsearchable during the spawn (fchdir fails): the task
    has started, so it is supervised to its end, never left running with a spawn
    failure reported."""
    monkeypatch.chdir(tmp_path)  # (restored at the end: this process stays in cwd)
    task_cwd = tmp_path / "task"
    task_cwd.mkdir()

    def refused(fd: int) -> None:
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))

    monkeypatch.setattr(os, "fchdir", refused)
    outcome = run(make_spec(tmp_path, ["sh", "-c", "exit 7"], cwd=str(task_cwd)))
    assert outcome.exit_code == 7


def test_an_entry_without_a_name_in_the_environment_does_not_stop_the_start(
    tmp_path: Path,
) -> None:
    """An ``=foo`` entry in ferry's own environment (os.environ reads it as the name
    "") started under ``subprocess``; ``posix_spawn`` refuses the name: it is left out,
    the task starts with the rest."""
    env = {"": "foo", "PATH": os.environ["PATH"], "KEPT": "1"}
    outcome = run(make_spec(tmp_path, ["/usr/bin/env"], env=env))
    assert outcome.exit_code == 0
    assert (tmp_path / "task.out").read_text().splitlines() == [
        f"PATH={env['PATH']}",
        "KEPT=1",
    ]


def test_stdin_fd_is_passed(tmp_path: Path) -> None:
    source = tmp_path / "input"
    source.write_bytes(b"from stdin\n")
    with source.open("rb") as f:
        script = "import sys; sys.stdout.buffer.write(sys.stdin.buffer.read())"
        run(make_spec(tmp_path, [PY, "-c", script], stdin=f.fileno()))
    assert (tmp_path / "task.out").read_bytes() == b"from stdin\n"


# -- capture -----------------------------------------------------------------------------


def test_logs_are_private_and_appended(tmp_path: Path) -> None:
    spec = make_spec(tmp_path, [PY, "-c", "import sys; print('one'); sys.stderr.write('e')"])
    run(spec)
    run(spec)
    assert (tmp_path / "task.out").read_text() == "one\none\n"
    assert (tmp_path / "task.err").read_text() == "ee"
    assert (tmp_path / "task.out").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "task.err").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "task.hb").stat().st_mode & 0o777 == 0o600


def test_a_stream_that_writes_nothing_gets_no_log(tmp_path: Path) -> None:
    """A log, and the logs' directory, are made at the stream's first byte: a task
    that prints nothing costs no inode (``work`` over many short tasks made four each)."""
    logs = tmp_path / "logs" / "task"
    paths = {"stdout_log": logs / "1.stdout", "stderr_log": logs / "1.stderr"}
    outcome = run(make_spec(tmp_path, [PY, "-c", "pass"], **paths))
    assert (outcome.exit_code, outcome.log_bytes) == (0, (0, 0))
    assert not (tmp_path / "logs").exists()
    script = "import sys; sys.stderr.write('only this')"
    outcome = run(make_spec(tmp_path, [PY, "-c", script], **paths))
    assert outcome.log_bytes == (0, 9)
    assert sorted(os.listdir(logs)) == ["1.stderr"]
    assert (logs / "1.stderr").read_text() == "only this"
    assert logs.stat().st_mode & 0o777 == 0o700


@pytest.mark.timeout(60)
@pytest.mark.parametrize("reader", [False, True])
def test_a_fifo_the_task_plants_in_its_logs_place_never_blocks_the_supervisor(
    tmp_path: Path, reader: bool
) -> None:
    """The log is made at the first byte: the task may have put something there by
    then. A FIFO would block the open for ever (no reader), or each write (a reader
    that does not read), and with them the timeout and every signal; it is refused
    instead (the task runs on, that log lost: log_error)."""
    logs = tmp_path / "logs" / "task"
    fifo = str(logs / "1.stdout")
    hold = f"held = os.open({fifo!r}, os.O_RDONLY | os.O_NONBLOCK);" if reader else ""
    script = (
        f"import os, sys; os.makedirs({str(logs)!r}); os.mkfifo({fifo!r}); {hold}"
        " print('hi', flush=True); sys.stderr.write('kept')"
    )
    spec = make_spec(
        tmp_path, [PY, "-c", script], stdout_log=logs / "1.stdout", stderr_log=logs / "1.stderr",
        timeout_s=20.0,
    )  # fmt: skip
    outcome = run(spec)
    assert (outcome.exit_code, outcome.timed_out) == (0, False)
    assert outcome.log_error is not None and "1.stdout" in outcome.log_error
    assert (logs / "1.stderr").read_text() == "kept"


@pytest.mark.parametrize("planted", ["the log", "its directory"])
def test_a_symlink_in_a_logs_place_is_refused_before_the_start(
    tmp_path: Path, planted: str
) -> None:
    logs = tmp_path / "logs" / "task"
    target = tmp_path / "elsewhere"
    target.mkdir()
    if planted == "the log":
        logs.mkdir(parents=True)
        (logs / "1.stdout").symlink_to(target / "bait")
    else:
        logs.parent.mkdir()
        logs.symlink_to(target)
    marker = tmp_path / "ran"
    spec = make_spec(
        tmp_path, [PY, "-c", f"open({str(marker)!r}, 'w')"],
        stdout_log=logs / "1.stdout", stderr_log=logs / "1.stderr",
    )  # fmt: skip
    with pytest.raises(SpawnFailed, match="not followed"):
        supervise(spec, on_spawned=lambda pid, pgid: None)
    assert not marker.exists(), "nothing started"
    assert os.listdir(target) == []


def test_stdout_and_stderr_are_kept_apart(tmp_path: Path) -> None:
    script = (
        "import sys\n"
        "for i in range(2000):\n"
        "    sys.stdout.write(f'out {i}\\n'); sys.stdout.flush()\n"
        "    sys.stderr.write(f'err {i}\\n'); sys.stderr.flush()\n"
    )
    run(make_spec(tmp_path, [PY, "-c", script]))
    assert (tmp_path / "task.out").read_text() == "".join(f"out {i}\n" for i in range(2000))
    assert (tmp_path / "task.err").read_text() == "".join(f"err {i}\n" for i in range(2000))


def test_hundred_thousand_lines_all_kept(tmp_path: Path) -> None:
    script = "import sys\nfor i in range(100_000):\n    print(f'line {i}')\n"
    run(make_spec(tmp_path, [PY, "-c", script]))
    lines = (tmp_path / "task.out").read_text().splitlines()
    assert lines == [f"line {i}" for i in range(100_000)]


def test_no_newline_and_nul_bytes_survive(tmp_path: Path) -> None:
    script = "import sys; sys.stdout.buffer.write(b'\\x00\\r\\nno newline\\xff')"
    run(make_spec(tmp_path, [PY, "-c", script]))
    assert (tmp_path / "task.out").read_bytes() == b"\x00\r\nno newline\xff"


# -- the supervisor in its own process ----------------------------------------------------


@pytest.fixture
def driver(tmp_path: Path) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []

    def start(
        argv: list[str],
        stdout: Any = subprocess.DEVNULL,
        stderr: Any = None,
        no_pidfd: bool = False,
        ignore_sighup: bool = False,
        **overrides: Any,
    ) -> subprocess.Popen[bytes]:
        spec = make_spec(tmp_path, argv, **overrides)
        config = {
            "argv": list(spec.argv),
            "cwd": spec.cwd,
            "env": dict(spec.env),
            "timeout_s": spec.timeout_s,
            "kill_grace_s": spec.kill_grace_s,
            "heartbeat_s": spec.heartbeat_s,
            "stdout_log": str(spec.stdout_log),
            "stderr_log": str(spec.stderr_log),
            "heartbeat_path": str(spec.heartbeat_path),
            "passthrough": spec.passthrough,
            "result": str(tmp_path / "result.json"),
            "spawned": str(tmp_path / "spawned"),
            "no_pidfd": no_pidfd,
            "ignore_sighup": ignore_sighup,
        }
        (tmp_path / "config.json").write_text(json.dumps(config))
        driver_argv = [PY, str(DRIVER), str(tmp_path / "config.json")]
        proc = subprocess.Popen(driver_argv, stdout=stdout, stderr=stderr)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def driver_outcome(proc: subprocess.Popen[bytes], tmp_path: Path) -> dict[str, Any]:
    assert proc.wait(timeout=DEADLINE_S) == 0
    outcome: dict[str, Any] = json.loads((tmp_path / "result.json").read_text())
    if "pgid" in outcome:
        assert_group_gone(outcome["pgid"])
    return outcome


@pytest.mark.parametrize(
    ("signum", "no_pidfd"),
    [
        (signal.SIGTERM, False),
        (signal.SIGINT, False),
        (signal.SIGHUP, False),
        (signal.SIGTERM, True),
    ],
)
def test_signal_to_the_supervisor_reaches_the_grandchild(
    tmp_path: Path, driver: Callable[..., subprocess.Popen[bytes]], signum: int, no_pidfd: bool
) -> None:
    marker, ready = tmp_path / "leaf.got", tmp_path / "leaf.ready"
    proc = driver([PY, "-c", TREE_ROOT, TREE_LEAF, str(marker), str(ready)], no_pidfd=no_pidfd)
    wait_for(ready.exists, "the grandchild to be ready")
    proc.send_signal(signum)
    outcome = driver_outcome(proc, tmp_path)
    assert marker.read_text() == str(int(signum))
    assert outcome["forwarded_signal"] == signum
    assert outcome["signal"] == signum  # the root died of the very signal
    assert not outcome["killed_after_grace"]


def test_second_signal_escalates_to_sigkill(
    tmp_path: Path, driver: Callable[..., subprocess.Popen[bytes]]
) -> None:
    marker, ready = tmp_path / "got", tmp_path / "ready"
    proc = driver([PY, "-c", STUBBORN, str(marker), str(ready)], kill_grace_s=3600.0)
    wait_for(ready.exists, "the task to ignore SIGTERM")
    proc.send_signal(signal.SIGTERM)
    wait_for(marker.exists, "the task to see SIGTERM")
    proc.send_signal(signal.SIGINT)
    outcome = driver_outcome(proc, tmp_path)
    assert outcome["signal"] == signal.SIGKILL
    assert outcome["forwarded_signal"] == signal.SIGTERM
    assert outcome["killed_after_grace"]


def test_twenty_megabytes_of_binary_byte_exact_in_log_and_passthrough(
    tmp_path: Path, driver: Callable[..., subprocess.Popen[bytes]]
) -> None:
    payload = os.urandom(20 * 1024 * 1024)
    source = tmp_path / "payload.bin"
    source.write_bytes(payload)
    script = f"import sys; sys.stdout.buffer.write(open({str(source)!r}, 'rb').read())"
    with (tmp_path / "ferry.stdout").open("wb") as ferry_stdout:
        proc = driver([PY, "-c", script], stdout=ferry_stdout, passthrough=True)
        outcome = driver_outcome(proc, tmp_path)
    assert outcome["exit_code"] == 0
    assert (tmp_path / "task.out").read_bytes() == payload
    assert (tmp_path / "ferry.stdout").read_bytes() == payload
    assert not (tmp_path / "task.err").exists(), "nothing written, no log made"


def test_passthrough_to_a_closed_stdout_closes_the_task_s_pipe_as_a_shell_pipe_would(
    tmp_path: Path, driver: Callable[..., subprocess.Popen[bytes]]
) -> None:
    # The task's next write after ferry's reader went fails, as with no ferry between
    # them (`yes | head -1`); its log holds what it wrote until then. (Before: ferry
    # read and logged on for ever, and `ferry run -- yes | head -1` never ended.)
    script = (
        "import signal, sys\nsignal.signal(signal.SIGPIPE, signal.SIG_DFL)\n"
        "for i in range(200_000):\n    print(f'line {i}')\nprint('done', file=sys.stderr)"
    )
    read_fd, write_fd = os.pipe()
    os.close(read_fd)  # nobody will ever read ferry's stdout: EPIPE on the first write
    try:
        proc = driver([PY, "-c", script], stdout=write_fd, passthrough=True)
    finally:
        os.close(write_fd)
    outcome = driver_outcome(proc, tmp_path)
    assert outcome["signal"] == signal.SIGPIPE
    everything = "".join(f"line {i}\n" for i in range(200_000))
    logged = (tmp_path / "task.out").read_text()
    assert len(logged) < len(everything) and everything.startswith(logged)
    assert not (tmp_path / "task.err").exists()


# -- timeouts, grace, stop requests ----------------------------------------------------------


def test_timeout_kills_the_whole_tree(tmp_path: Path, process_api: str) -> None:
    marker, ready = tmp_path / "leaf.got", tmp_path / "leaf.ready"
    spec = make_spec(
        tmp_path, [PY, "-c", TREE_ROOT, TREE_LEAF, str(marker), str(ready)], timeout_s=0.0
    )
    outcome = run(spec, on_spawned=ready_waiter(ready))
    assert outcome.timed_out
    assert outcome.signal == signal.SIGTERM
    assert marker.read_text() == str(int(signal.SIGTERM))
    assert_group_vanishes(outcome.pgid)


def test_grace_then_sigkill_for_a_task_ignoring_sigterm(tmp_path: Path, process_api: str) -> None:
    marker, ready = tmp_path / "got", tmp_path / "ready"
    spec = make_spec(
        tmp_path, [PY, "-c", STUBBORN, str(marker), str(ready)], timeout_s=0.0, kill_grace_s=0.2
    )
    outcome = run(spec, on_spawned=ready_waiter(ready))
    assert outcome.timed_out and outcome.killed_after_grace
    assert outcome.signal == signal.SIGKILL
    assert marker.read_text() == "TERM\n"


def test_should_stop_forwards_its_signal(tmp_path: Path, process_api: str) -> None:
    marker, ready = tmp_path / "leaf.got", tmp_path / "leaf.ready"
    spec = make_spec(
        tmp_path, [PY, "-c", TREE_ROOT, TREE_LEAF, str(marker), str(ready)], heartbeat_s=0.05
    )
    outcome = run(spec, should_stop=lambda: signal.SIGHUP if ready.exists() else None)
    assert outcome.stop_signal == signal.SIGHUP
    assert outcome.forwarded_signal is None
    assert outcome.signal == signal.SIGHUP
    assert marker.read_text() == str(int(signal.SIGHUP))


def test_on_spawned_raising_kills_the_group_and_reraises(tmp_path: Path, process_api: str) -> None:
    marker, ready = tmp_path / "got", tmp_path / "ready"
    spec = make_spec(tmp_path, [PY, "-c", STUBBORN, str(marker), str(ready)])
    seen: list[int] = []

    def on_spawned(pid: int, pgid: int) -> None:
        seen.append(pgid)
        wait_for(ready.exists, "the task to start")
        raise RuntimeError("journal full")

    with pytest.raises(RuntimeError, match="journal full"):
        supervise(spec, on_spawned=on_spawned)
    with pytest.raises(ChildProcessError):
        os.waitpid(seen[0], os.WNOHANG)
    assert_group_vanishes(seen[0])


def test_quiet_task_keeps_its_heartbeat_fresh(tmp_path: Path) -> None:
    heartbeat = tmp_path / "task.hb"
    mtimes: list[int] = []

    def should_stop() -> int | None:
        # Polled right after each beat: stop once the mtime moved three times.
        mtimes.append(heartbeat.stat().st_mtime_ns)
        return signal.SIGTERM if len(set(mtimes)) >= 4 else None

    spec = make_spec(tmp_path, [PY, "-c", SILENT], heartbeat_s=0.2)
    outcome = run(spec, should_stop=should_stop)
    assert outcome.signal == signal.SIGTERM
    assert mtimes == sorted(mtimes)
    assert len(set(mtimes)) >= 4
    assert not (tmp_path / "task.out").exists(), "nothing written, no log made"


def test_leftover_background_child_is_terminated_after_a_normal_exit(
    tmp_path: Path, process_api: str
) -> None:
    marker, ready = tmp_path / "leaf.got", tmp_path / "leaf.ready"
    script = (
        "import subprocess, sys\n"
        f"subprocess.Popen([sys.executable, '-c', {TREE_LEAF!r}, {str(marker)!r}, {str(ready)!r}])\n"
        "print('leader done')\n"
    )
    spec = make_spec(tmp_path, [PY, "-c", script])
    outcome = run(spec, on_spawned=ready_waiter(ready))
    assert (outcome.exit_code, outcome.signal) == (0, None)
    assert outcome.leftover_killed
    assert marker.read_text() == str(int(signal.SIGTERM))
    assert (tmp_path / "task.out").read_text() == "leader done\n"
    assert_group_vanishes(outcome.pgid)


def test_leftover_ignoring_sigterm_is_killed_after_grace(tmp_path: Path, process_api: str) -> None:
    marker, ready = tmp_path / "got", tmp_path / "ready"
    script = (
        "import subprocess, sys\n"
        f"subprocess.Popen([sys.executable, '-c', {STUBBORN!r}, {str(marker)!r}, {str(ready)!r}])\n"
    )
    spec = make_spec(tmp_path, [PY, "-c", script], kill_grace_s=0.2)
    outcome = run(spec, on_spawned=ready_waiter(ready))
    assert outcome.exit_code == 0 and outcome.leftover_killed and outcome.killed_after_grace
    assert int(ready.read_text()) not in live_members(outcome.pgid)


def test_signal_handlers_and_wakeup_fd_are_restored(tmp_path: Path) -> None:
    def mine(signum: int, frame: object) -> None:
        pass

    old = signal.signal(signal.SIGTERM, mine)
    try:
        wakeup_read, wakeup_write = os.pipe()
        os.set_blocking(wakeup_write, False)
        previous_wakeup = signal.set_wakeup_fd(wakeup_write)
        try:
            run(make_spec(tmp_path, [PY, "-c", "pass"]))
            assert signal.getsignal(signal.SIGTERM) is mine
            assert signal.set_wakeup_fd(wakeup_write) == wakeup_write
        finally:
            signal.set_wakeup_fd(previous_wakeup)
            os.close(wakeup_read)
            os.close(wakeup_write)
    finally:
        signal.signal(signal.SIGTERM, old)


# -- deeper: corner cases of the choices in the module docstring -----------------------------


def test_stderr_passes_through_to_fd2(
    tmp_path: Path, driver: Callable[..., subprocess.Popen[bytes]]
) -> None:
    payload = os.urandom(3 * 1024 * 1024)
    source = tmp_path / "payload.bin"
    source.write_bytes(payload)
    script = f"import sys; sys.stderr.buffer.write(open({str(source)!r}, 'rb').read())"
    with (tmp_path / "ferry.stderr").open("wb") as ferry_stderr:
        proc = driver([PY, "-c", script], stderr=ferry_stderr, passthrough=True)
        outcome = driver_outcome(proc, tmp_path)
    assert outcome["exit_code"] == 0
    assert (tmp_path / "task.err").read_bytes() == payload
    assert (tmp_path / "ferry.stderr").read_bytes() == payload


def test_both_streams_large_at_once_do_not_deadlock(tmp_path: Path) -> None:
    # 8 MiB on stderr before anything on stdout: a reader of one pipe only would hang.
    script = (
        "import sys\n"
        "sys.stderr.buffer.write(b'e' * (8 << 20)); sys.stderr.flush()\n"
        "sys.stdout.buffer.write(b'o' * (8 << 20))\n"
    )
    run(make_spec(tmp_path, [PY, "-c", script]))
    assert (tmp_path / "task.err").read_bytes() == b"e" * (8 << 20)
    assert (tmp_path / "task.out").read_bytes() == b"o" * (8 << 20)


def test_timeout_fires_while_the_task_floods_output(tmp_path: Path) -> None:
    script = "import sys\nwhile True:\n    sys.stdout.buffer.write(b'y' * 65536)\n"
    outcome = run(make_spec(tmp_path, [PY, "-c", script], timeout_s=0.5))
    assert outcome.timed_out and outcome.signal == signal.SIGTERM
    assert (tmp_path / "task.out").stat().st_size > 0


def test_timeout_continues_a_stopped_task_so_it_can_die_of_sigterm(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    script = f"open({str(ready)!r}, 'w').close()\nimport time\nwhile True: time.sleep(60)"

    def stop_it(pid: int, pgid: int) -> None:
        wait_for(ready.exists, "the task to start")
        os.kill(pid, signal.SIGSTOP)
        wait_for(lambda: Path(f"/proc/{pid}/stat").read_bytes().split(b") ")[1][:1] == b"T", "stop")

    spec = make_spec(tmp_path, [PY, "-c", script], timeout_s=0.0, kill_grace_s=3600.0)
    outcome = run(spec, on_spawned=stop_it)
    assert outcome.timed_out and outcome.signal == signal.SIGTERM
    assert not outcome.killed_after_grace


def test_signal_arriving_before_the_loop_is_forwarded(tmp_path: Path) -> None:
    # on_spawned runs before the loop; a SIGTERM then must neither kill ferry (the trap
    # is in place before the spawn) nor be lost.
    def signal_self(pid: int, pgid: int) -> None:
        os.kill(os.getpid(), signal.SIGTERM)

    previous = signal.getsignal(signal.SIGTERM)
    outcome = run(make_spec(tmp_path, [PY, "-c", SILENT]), on_spawned=signal_self)
    assert outcome.forwarded_signal == signal.SIGTERM
    assert outcome.signal == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) == previous


def test_inherited_ignored_sighup_is_not_forwarded(
    tmp_path: Path, driver: Callable[..., subprocess.Popen[bytes]]
) -> None:
    marker, ready = tmp_path / "leaf.got", tmp_path / "leaf.ready"
    proc = driver([PY, "-c", TREE_ROOT, TREE_LEAF, str(marker), str(ready)], ignore_sighup=True)
    wait_for(ready.exists, "the grandchild to be ready")
    proc.send_signal(signal.SIGHUP)  # ignored by ferry, as under nohup
    proc.send_signal(signal.SIGTERM)
    outcome = driver_outcome(proc, tmp_path)
    assert marker.read_text() == str(int(signal.SIGTERM))
    assert outcome["forwarded_signal"] == signal.SIGTERM


def test_outside_the_main_thread_no_handler_is_installed_and_should_stop_works(
    tmp_path: Path,
) -> None:
    import threading

    ready = tmp_path / "ready"
    script = f"open({str(ready)!r}, 'w').close()\nimport time\nwhile True: time.sleep(60)"
    spec = make_spec(tmp_path, [PY, "-c", script], heartbeat_s=0.05)
    before = signal.getsignal(signal.SIGTERM)
    results: list[Outcome] = []
    installed: list[object] = []

    def should_stop() -> int | None:
        installed.append(signal.getsignal(signal.SIGTERM))
        return signal.SIGTERM if ready.exists() else None

    thread = threading.Thread(target=lambda: results.append(run(spec, should_stop=should_stop)))
    thread.start()
    thread.join(DEADLINE_S)
    assert not thread.is_alive()
    assert results[0].signal == signal.SIGTERM and results[0].stop_signal == signal.SIGTERM
    assert set(installed) == {before}


def test_heartbeat_file_removed_mid_run_is_recreated(tmp_path: Path) -> None:
    heartbeat = tmp_path / "task.hb"
    calls: list[bool] = []

    def should_stop() -> int | None:
        calls.append(heartbeat.exists())
        if len(calls) == 1:
            heartbeat.unlink()
        return signal.SIGTERM if len(calls) >= 3 else None

    run(make_spec(tmp_path, [PY, "-c", SILENT], heartbeat_s=0.05), should_stop=should_stop)
    assert calls == [True, True, True]
    assert heartbeat.stat().st_mode & 0o777 == 0o600


def test_log_write_failure_is_reported_and_the_task_still_runs_to_its_end(tmp_path: Path) -> None:
    script = (
        "import sys\nsys.stdout.write('x' * 100000)\nsys.stderr.write('still here')\nsys.exit(7)"
    )
    # (/dev/full is refused as a log, not a regular file; a full disk's ENOSPC on a
    # write is tests/integration/test_faults.py::test_disk_full_during_a_log_write.)
    spec = make_spec(tmp_path, [PY, "-c", script], stdout_log=Path("/dev/full"))
    outcome = run(spec)
    assert outcome.exit_code == 7
    assert outcome.log_error is not None and "not a regular file" in outcome.log_error
    assert (tmp_path / "task.err").read_text() == "still here"


def test_child_that_left_the_group_holding_the_pipe_bounds_the_drain(tmp_path: Path) -> None:
    # A daemon that called setsid is no longer the task's group: ferry does not kill it,
    # and stops waiting for its end of the pipe after DRAIN_TIMEOUT_S.
    ready = tmp_path / "daemon.pid"
    daemon = f"import os, time\nopen({str(ready)!r}, 'w').write(str(os.getpid()))\ntime.sleep(120)"
    script = (
        "import subprocess, sys\n"
        f"subprocess.Popen([sys.executable, '-c', {daemon!r}], start_new_session=True)\n"
        "print('leader done', flush=True)\n"
    )
    try:
        outcome = run(make_spec(tmp_path, [PY, "-c", script]), on_spawned=ready_waiter(ready))
        assert outcome.exit_code == 0 and not outcome.leftover_killed
        assert outcome.drain_timed_out
        assert (tmp_path / "task.out").read_text() == "leader done\n"
    finally:
        if ready.exists():
            daemon_pid = int(ready.read_text())
            os.kill(daemon_pid, signal.SIGKILL)
            wait_for(lambda: not live_members(daemon_pid), "the daemon to die")


@pytest.mark.parametrize(
    "bad", [{"argv": []}, {"heartbeat_s": 0.0}, {"kill_grace_s": -1.0}, {"timeout_s": float("nan")}]
)
def test_nonsense_spec_is_refused_before_anything_starts(
    tmp_path: Path, bad: dict[str, Any]
) -> None:
    spec = make_spec(tmp_path, **{"argv": [PY, "-c", "pass"], **bad})
    with pytest.raises(ValueError):
        supervise(spec, on_spawned=lambda pid, pgid: None)
    assert not (tmp_path / "task.out").exists()


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")
def test_logs_with_bytes_are_fdatasynced_before_supervise_returns(tmp_path: Path) -> None:
    # Traced system calls of the supervising process (not -f: the task is not traced).
    script = "import sys; sys.stdout.write('evidence')"
    config = {
        "argv": [PY, "-c", script],
        "cwd": str(tmp_path),
        "env": dict(os.environ),
        "timeout_s": None,
        "kill_grace_s": 5.0,
        "heartbeat_s": 5.0,
        "stdout_log": str(tmp_path / "task.out"),
        "stderr_log": str(tmp_path / "task.err"),
        "heartbeat_path": str(tmp_path / "task.hb"),
        "passthrough": False,
        "result": str(tmp_path / "result.json"),
        "spawned": str(tmp_path / "spawned"),
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    trace = tmp_path / "trace.txt"
    strace = ["strace", "-qq", "-e", "trace=openat,fdatasync,fsync", "-o", str(trace)]
    traced = subprocess.run(
        [*strace, PY, str(DRIVER), str(tmp_path / "config.json")],
        capture_output=True,
        timeout=DEADLINE_S,
    )
    if traced.returncode != 0 and b"ptrace" in traced.stderr:
        pytest.skip("ptrace not permitted here")
    assert traced.returncode == 0, traced.stderr
    calls = trace.read_text().splitlines()

    def index(pattern: str) -> int:
        hits = [i for i, line in enumerate(calls) if re.search(pattern, line)]
        assert hits, f"no {pattern!r} in the trace"
        return hits[0]

    out_fd = re.search(r"= (\d+)$", calls[index(r'openat\(.*task\.out"')])
    assert out_fd is not None
    synced = index(rf"^fdatasync\({out_fd.group(1)}\)\s+= 0")
    dir_open = index(rf'openat\(AT_FDCWD, "{re.escape(str(tmp_path))}", .*O_DIRECTORY')
    dir_fd = re.search(r"= (\d+)$", calls[dir_open])
    assert dir_fd is not None
    dir_synced = index(rf"^fsync\({dir_fd.group(1)}\)\s+= 0")
    returned = index(r'openat\(.*result\.json"')
    assert synced < returned and dir_open < dir_synced < returned
    # stderr stayed empty: no log made, nothing to make durable.
    assert not [c for c in calls if re.search(r'openat\(.*task\.err"', c)]
    assert (tmp_path / "task.out").read_text() == "evidence"
    assert not (tmp_path / "task.err").exists()


# -- a reader of ferry's stdout that stops reading -----------------------------------------

FLOOD = "import sys\nwhile True:\n    sys.stdout.buffer.write(b'0123456789abcdef' * 4096)\n"


def read_to_eof(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


def read_until_exit(fd: int, proc: subprocess.Popen[bytes]) -> bytes:
    """What ferry passed to ``fd`` (a pipe's read end, a terminal's master), read until
    ferry has exited and nothing is left (the test may hold a writing end itself)."""
    chunks: list[bytes] = []
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        exited = proc.poll() is not None
        if not select.select([fd], [], [], 0 if exited else 0.1)[0]:
            if exited:
                return b"".join(chunks)
            continue
        try:
            chunk = os.read(fd, 1 << 20)
        except OSError as e:  # a terminal's master once no process holds the terminal
            if e.errno != errno.EIO:
                raise
            chunk = b""
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
    raise AssertionError("ferry did not exit once its output was read")


@pytest.fixture(params=["pipe", "terminal"])
def stalled(request: pytest.FixtureRequest) -> Iterator[tuple[int, int]]:
    """(reader, writer): ferry's stdout, which nobody reads until the test does. A pipe
    (``ferry run | less``), or a terminal: a pseudo-terminal in raw mode (bytes pass
    unchanged) whose output buffer fills, as behind a terminal stopped by ^S."""
    if request.param == "pipe":
        reader, writer = os.pipe()
    else:
        reader, writer = os.openpty()
        tty.setraw(writer)
    try:
        yield reader, writer
    finally:
        os.close(reader)
        os.close(writer)


def assert_blocking(fd: int) -> None:
    """ferry left the description it was given as it was (the user's shell shares it)."""
    assert not fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_NONBLOCK


def spawned_pgid(tmp_path: Path) -> int:
    spawned = tmp_path / "spawned"
    wait_for(spawned.exists, "the task to be spawned")
    return int(spawned.read_text().split()[1])


def test_stalled_stdout_reader_does_not_stop_the_timeout(
    tmp_path: Path, driver: Callable[..., subprocess.Popen[bytes]], stalled: tuple[int, int]
) -> None:
    reader, writer = stalled
    proc = driver([PY, "-c", FLOOD], stdout=writer, passthrough=True, timeout_s=0.5)
    pgid = spawned_pgid(tmp_path)
    # Nobody reads ferry's stdout, yet the timeout ends the task.
    wait_for(lambda: live_members(pgid) == [], "the timeout to end the stalled task")
    assert_blocking(writer)
    passed = read_until_exit(reader, proc)  # now read: ferry writes the rest and exits
    outcome = driver_outcome(proc, tmp_path)
    assert outcome["timed_out"] and outcome["passthrough_error"] is None
    log = (tmp_path / "task.out").read_bytes()
    assert len(log) > 0 and passed == log


def test_signals_reach_the_task_and_end_ferry_while_its_stdout_reader_stalls(
    tmp_path: Path, driver: Callable[..., subprocess.Popen[bytes]], stalled: tuple[int, int]
) -> None:
    reader, writer = stalled
    proc = driver([PY, "-c", FLOOD], stdout=writer, passthrough=True)
    pgid = spawned_pgid(tmp_path)
    # The log runs ahead of the stalled passthrough by a whole backlog.
    out = tmp_path / "task.out"  # (made at the task's first byte)
    backlog_built = lambda: out.exists() and out.stat().st_size > ECHO_BACKLOG_BYTES  # noqa: E731
    wait_for(backlog_built, "a passthrough backlog to build up")
    proc.send_signal(signal.SIGTERM)  # forwarded although ferry's stdout is stalled
    wait_for(lambda: live_members(pgid) == [], "the forwarded SIGTERM to end the task")
    proc.send_signal(signal.SIGTERM)  # and the next one gives up the passthrough
    outcome = driver_outcome(proc, tmp_path)
    passed = read_until_exit(reader, proc)
    assert outcome["signal"] == signal.SIGTERM and outcome["forwarded_signal"] == signal.SIGTERM
    assert "stalled" in outcome["passthrough_error"]
    log = (tmp_path / "task.out").read_bytes()
    assert log.startswith(passed) and len(passed) < len(log)


# Writes to stdout, waits until ferry has logged all of it (so ferry has read it), then
# a line to stderr.
STDOUT_THEN_STDERR = """
import os, sys, time
log, size = sys.argv[1], int(sys.argv[2])
sys.stdout.buffer.write(b"o" * size)
sys.stdout.flush()
while not (os.path.exists(log) and os.path.getsize(log) == size):
    time.sleep(0.01)
sys.stderr.write("the end")
"""


def test_both_streams_into_one_stalled_reader_keep_their_order(
    tmp_path: Path, driver: Callable[..., subprocess.Popen[bytes]], stalled: tuple[int, int]
) -> None:
    # `ferry run ... 2>&1 | less`, or a terminal: stdout and stderr are one destination.
    # Behind a stalled reader, what stderr says last must not pass what stdout said
    # before it (each stream kept a backlog of its own).
    reader, writer = stalled
    size = ECHO_BACKLOG_BYTES // 2  # more than the reader's pipe takes, less than a backlog
    argv = [PY, "-c", STDOUT_THEN_STDERR, str(tmp_path / "task.out"), str(size)]
    proc = driver(argv, stdout=writer, stderr=writer, passthrough=True)
    wait_for(lambda: (tmp_path / "task.err").exists(), "the task's last line")
    passed = read_until_exit(reader, proc)
    outcome = driver_outcome(proc, tmp_path)
    assert outcome["exit_code"] == 0 and outcome["passthrough_error"] is None
    assert passed == b"o" * size + b"the end"


def test_a_signal_after_the_task_ended_gives_up_a_stalled_passthrough_in_any_event_order(
    tmp_path: Path, process_api: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The second signal comes once the task has ended but before the loop has seen it
    # end: its wakeup byte and the pidfd's event then come in one batch, the wakeup
    # first (epoll keeps the level-triggered wakeup fd, ready the round before, at the
    # head of its ready list), and without a pidfd the leader is only polled. It was
    # spent on a SIGKILL to nobody; the stalled passthrough then held ferry for ever.
    sync_interest = TaskLoop._sync_interest
    sent: list[str] = []
    watchdog: list[threading.Timer] = []

    def give_up() -> None:  # only if ferry hangs: a third signal ends it
        sent.append("third")
        os.kill(os.getpid(), signal.SIGTERM)

    def user(loop: TaskLoop) -> None:  # (just before the loop's select)
        if not sent and loop.sinks[0].backlogged:
            sent.append("first")
            signal.raise_signal(signal.SIGTERM)  # forwarded
        elif sent == ["first"] and loop.stopping:
            wait_for(lambda: live_members(loop.proc.pid) == [], "the task to end")
            poll, wakeup_fd = loop.sel.poll, loop.trap.wakeup_fd
            loop.sel.poll = lambda timeout=None: sorted(  # type: ignore[method-assign]
                poll(timeout), key=lambda event: event[0] != wakeup_fd
            )
            sent.append("second")
            signal.raise_signal(signal.SIGTERM)
            watchdog.append(threading.Timer(DEADLINE_S, give_up))
            watchdog[0].start()
        sync_interest(loop)

    monkeypatch.setattr(TaskLoop, "_sync_interest", user)
    read_fd, write_fd = os.pipe()  # nobody reads it
    spec = make_spec(tmp_path, [PY, "-c", FLOOD], passthrough=True, stdout_echo_fd=write_fd)
    try:
        with SignalTrap() as trap:  # (still in place if the watchdog fires late)
            try:
                outcome = run(spec, trap=trap)
            finally:
                for timer in watchdog:
                    timer.cancel()
                    timer.join()
    finally:
        os.close(read_fd)
        os.close(write_fd)
    assert sent == ["first", "second"]
    assert outcome.forwarded_signal == signal.SIGTERM and outcome.signal == signal.SIGTERM
    assert not outcome.killed_after_grace
    assert outcome.passthrough_error is not None and "stalled" in outcome.passthrough_error


def test_twenty_megabytes_byte_exact_through_a_piped_stdout(
    tmp_path: Path, driver: Callable[..., subprocess.Popen[bytes]]
) -> None:
    # A pipe to ferry's stdout goes through the non-blocking passthrough and its backlog;
    # a reader in this process (sharing the GIL with nothing fast) lags now and then.
    import threading

    payload = os.urandom(20 * 1024 * 1024)
    source = tmp_path / "payload.bin"
    source.write_bytes(payload)
    script = (
        "import sys\n"
        f"data = open({str(source)!r}, 'rb').read()\n"
        "for i in range(0, len(data), 100_000):\n"
        "    sys.stdout.buffer.write(data[i : i + 100_000])\n"
    )
    read_fd, write_fd = os.pipe()
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(read_to_eof(read_fd)))
    reader.start()
    try:
        proc = driver([PY, "-c", script], stdout=write_fd, passthrough=True)
    finally:
        os.close(write_fd)
    outcome = driver_outcome(proc, tmp_path)
    reader.join(DEADLINE_S)
    os.close(read_fd)
    assert outcome["exit_code"] == 0 and outcome["passthrough_error"] is None
    assert received == [payload]
    assert (tmp_path / "task.out").read_bytes() == payload


# -- the passthrough sink on its own (real pipes and files) --------------------------------


@pytest.fixture
def sink_fds(tmp_path: Path) -> Iterator[tuple[LogFile, int, int]]:
    """(the log, read end, write end) of a log file (made at its first byte) and a
    64 KiB pipe."""
    read_fd, write_fd = os.pipe()
    yield LogFile(tmp_path / "sink.log"), read_fd, write_fd
    for fd in (read_fd, write_fd):
        with contextlib.suppress(OSError):
            os.close(fd)


def test_sink_queues_what_a_full_pipe_cannot_take_and_keeps_order(
    tmp_path: Path, sink_fds: tuple[LogFile, int, int]
) -> None:
    log, read_fd, write_fd = sink_fds
    sink = Sink(log, Echo(write_fd))
    chunks = [os.urandom(600_000) for _ in range(5)]  # more than the (widened) pipe holds
    for chunk in chunks:
        sink.write(chunk)  # never blocks, although nobody reads yet
    assert sink.wants_write and 0 < sink.backlog_bytes < 3_000_000
    received = b""
    while sink.wants_write:
        received += os.read(read_fd, 1 << 20)
        sink.flush()
    os.close(write_fd)
    received += read_to_eof(read_fd)
    sink.sync_and_close()
    assert received == b"".join(chunks)
    assert (tmp_path / "sink.log").read_bytes() == b"".join(chunks)


def test_sink_without_rwf_nowait_support_writes_blocking(
    tmp_path: Path, sink_fds: tuple[LogFile, int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    log, read_fd, write_fd = sink_fds

    def old_kernel(*args: object) -> int:
        raise OSError(errno.EOPNOTSUPP, "Operation not supported")

    monkeypatch.setattr(os, "pwritev", old_kernel)
    sink = Sink(log, Echo(write_fd))
    sink.write(b"small enough for the pipe")
    assert not sink.wants_write and sink.echo_error is None
    sink.sync_and_close()
    assert os.read(read_fd, 100) == b"small enough for the pipe"


def test_sink_with_a_closed_reader_stops_passthrough_and_keeps_logging(
    tmp_path: Path, sink_fds: tuple[LogFile, int, int]
) -> None:
    log, read_fd, write_fd = sink_fds
    os.close(read_fd)
    sink = Sink(log, Echo(write_fd))
    sink.write(b"first")
    sink.write(b"second")
    assert sink.echo_fd is None and sink.echo_error is not None
    sink.sync_and_close()
    assert (tmp_path / "sink.log").read_bytes() == b"firstsecond"


def test_a_sink_on_a_terminal_that_takes_nothing_queues_and_leaves_its_flags(
    tmp_path: Path,
) -> None:
    master, slave = os.openpty()
    tty.setraw(slave)
    try:
        sink = Sink(LogFile(tmp_path / "sink.log"), Echo(slave))
        chunks = [os.urandom(100_000) for _ in range(5)]  # more than the terminal holds
        for chunk in chunks:
            sink.write(chunk)  # never blocks, although nobody reads the terminal
        assert sink.wants_write and sink.echo_fd not in (None, slave)
        assert_blocking(slave)
        received = b""
        deadline = time.monotonic() + DEADLINE_S
        while sink.wants_write and time.monotonic() < deadline:
            received += os.read(master, 1 << 20)
            sink.flush()
        while select.select([master], [], [], 0)[0]:
            received += os.read(master, 1 << 20)
        sink.sync_and_close()
        assert received == b"".join(chunks)
        assert (tmp_path / "sink.log").read_bytes() == b"".join(chunks)
    finally:
        os.close(master)
        os.close(slave)


def test_streams_into_one_pipe_or_terminal_share_one_passthrough(tmp_path: Path) -> None:
    read_fd, write_fd = os.pipe()
    master, slave = os.openpty()
    other_read, other_write = os.pipe()
    file_fd = os.open(tmp_path / "out", os.O_WRONLY | os.O_CREAT, 0o600)
    copies = [os.dup(write_fd), os.dup(slave), os.dup(file_fd)]
    try:
        for one, two in [(write_fd, copies[0]), (slave, copies[1])]:
            out, err = echoes(one, two)
            assert out is not None and out is err
            out.close()
        # Two pipes, and a file (each of its descriptors has its own offset): one each.
        for one, two in [(write_fd, other_write), (file_fd, copies[2])]:
            out, err = echoes(one, two)
            assert out is not None and err is not None and out is not err
        assert echoes(None, write_fd)[0] is None and echoes(write_fd, None)[1] is None
    finally:
        for fd in [read_fd, write_fd, master, slave, other_read, other_write, file_fd, *copies]:
            os.close(fd)


def test_passthrough_to_a_terminal_s_master_side_reaches_its_slave(
    tmp_path: Path, driver: Callable[..., subprocess.Popen[bytes]]
) -> None:
    # ferry's stdout the master of a pseudo-terminal (a program that runs ferry under a
    # terminal of its own, reading the slave). Opened again by its name, a master is a
    # new terminal (/dev/ptmx clones): passthrough went there, to nobody, and past its
    # buffer ferry waited for a reader for ever (found by a review).
    master, slave = os.openpty()
    tty.setraw(slave)
    try:
        size = 100_000  # more than a terminal's buffer
        proc = driver([PY, "-c", f"import sys; sys.stdout.write('x' * {size})"],
                      stdout=master, passthrough=True)  # fmt: skip
        passed = read_until_exit(slave, proc)
        outcome = driver_outcome(proc, tmp_path)
    finally:
        os.close(master)
        os.close(slave)
    assert outcome["exit_code"] == 0 and outcome["passthrough_error"] is None
    assert passed == b"x" * size


def test_two_terminals_masters_are_two_destinations() -> None:
    # Every master is the same device and inode (/dev/ptmx): not one destination.
    first, first_slave = os.openpty()
    second, second_slave = os.openpty()
    try:
        out, err = echoes(first, second)
        assert out is not None and err is not None and out is not err
        shared = echoes(first, first)
        assert shared[0] is shared[1]  # (one descriptor twice: one destination)
    finally:
        for fd in (first, first_slave, second, second_slave):
            os.close(fd)
