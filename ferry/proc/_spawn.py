"""Start one task's command in a new session, and name why it could not start.

``os.posix_spawn``, not ``subprocess``: importing ``subprocess`` (with ``locale`` and
``selectors``) in a freshly forked supervisor was the last step on ``ferry run``'s
critical path (docs/architecture.md, start-up). What ``subprocess.Popen`` did for
ferry is done here, the same way:

* the program is looked up on the task's ``PATH`` (``env``'s, as ``Popen(env=...)``
  does), a name with a slash taken as it is: each place in turn where the name is,
  with an exec, and one where that exec fails is passed over for a later one (a
  script whose interpreter is missing, a file without ``#!``...), the first such
  failure reported if none starts, as ``Popen`` and ``execvpe`` do; a failed exec is
  an ``OSError`` raised by ``posix_spawn`` in the supervisor (glibc reports the
  child's exec error), so the kind of failure is known before ``supervise`` returns:
  the exit codes 127/126 of the contract, as a shell would choose them;
* the working directory: the supervisor enters it for the spawn and goes back, to
  its own even when it may not read it (an ``O_PATH`` descriptor; ``os.posix_spawn``
  has no action for it; the supervisor is single-threaded when it spawns);
* the environment: an entry without a name (``=foo`` in ferry's own, which
  ``os.environ`` reads as the name ``""``) is left out: ``posix_spawn`` refuses
  that name, ``Popen`` passed the entry on;
* ``close_fds``: a descriptor the supervisor holds without close-on-exec (ferry opens
  none: Python's are close-on-exec) is made close-on-exec for the spawn only (not a
  close action: glibc refuses one above the soft RLIMIT_NOFILE, which an inherited
  descriptor may be); ``pass_fds`` are made inheritable for the spawn only;
* ``restore_signals``: SIGPIPE and SIGXFSZ, which Python ignores, are at their default
  in the task; a new session (``setsid``), so signals reach the task's whole tree.
  (glibc's ``posix_spawn`` leaves its own signals 32 and 33 ignored in the child,
  which Python cannot name in ``setsigdef``: the one difference a task can see.)
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time

from ferry.core.errors import EX_FERRY_FAILED, EX_NOT_EXECUTABLE, EX_NOT_FOUND_CMD, SpawnError
from ferry.proc._sink import widen_pipe
from ferry.proc._supervise_types import SuperviseSpec

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import BinaryIO

PIPE_BYTES = 1 << 20  # the unprivileged maximum (/proc/sys/fs/pipe-max-size) by default

_KIND_EXIT = {"not_found": EX_NOT_FOUND_CMD, "not_executable": EX_NOT_EXECUTABLE}
# exec's errors on a path that is there but cannot be run: 126, as a shell gives (a
# symlink loop, a name too long among them).
_NOT_EXECUTABLE_ERRNOS = frozenset(
    {errno.EACCES, errno.EPERM, errno.ENOEXEC, errno.EISDIR, errno.ENOTDIR, errno.ETXTBSY,
     errno.ELOOP, errno.ENAMETOOLONG}
)  # fmt: skip
# Where a bare name is looked for on PATH, a place that cannot hold it: passed over.
_NOT_THERE_ERRNOS = (errno.ENOENT, errno.ENOTDIR, errno.ELOOP, errno.ENAMETOOLONG)
_DEFAULT_IN_TASK = (signal.SIGPIPE, signal.SIGXFSZ)  # ignored by Python, not by tasks
_WAIT_POLL_S = 0.005


class SpawnFailed(SpawnError):
    """The command could not be started. ``kind``: not_found (127), not_executable
    (126, a directory too), other (125: a bad cwd, fork failure, E2BIG...).
    ``spawned``: its child was made, then killed at once (it could not be watched), so
    the command may have begun: said in ``details``."""

    def __init__(
        self, kind: str, message: str, *, errno_: int | None = None, spawned: bool = False
    ) -> None:
        details: dict[str, object] = {"kind": kind, "errno": errno_}
        if spawned:
            details["spawned"] = True
        super().__init__(
            message,
            code=f"spawn.{kind}",
            details=details,
            exit_code=_KIND_EXIT.get(kind, EX_FERRY_FAILED),
        )
        self.kind = kind
        self.errno = errno_


class WaitTimeout(Exception):
    """``Child.wait(timeout)`` ran out of time: the child has not exited."""


class Child:
    """The task's leader, as its supervisor holds it: its pid, the read ends of its
    output (``stdout``; ``stderr`` None on a pseudo-terminal), and its exit status once
    reaped (``returncode``: the exit code, or minus the signal that killed it)."""

    def __init__(self, pid: int, stdout: BinaryIO, stderr: BinaryIO | None) -> None:
        self.pid, self.stdout, self.stderr = pid, stdout, stderr
        self.returncode: int | None = None

    def wait(self, timeout: float | None = None) -> int:
        """Reap it (at once if it has exited); ``WaitTimeout`` after ``timeout``."""
        if self.returncode is None:
            if timeout is None:
                _, status = os.waitpid(self.pid, 0)
            else:
                status = self._poll_until(time.monotonic() + timeout)
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def _poll_until(self, deadline: float) -> int:
        while True:  # (only a kill's wait does this: rare, and short)
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return status
            if time.monotonic() >= deadline:
                raise WaitTimeout(f"pid {self.pid} still running")
            time.sleep(_WAIT_POLL_S)


def spawn_failed(e: OSError | ValueError, program: str) -> SpawnFailed:
    if isinstance(e, ValueError):  # an env key with "=" or a NUL byte somewhere
        return SpawnFailed("other", f"cannot start {program!r}: {e}")
    code = e.errno
    bare_name = "/" not in program
    path = e.filename if isinstance(e.filename, str) else program
    if code == errno.ENOENT and "/" in path and os.path.exists(path):
        # The file is there: what exec did not find is what it names to run it.
        return SpawnFailed("not_found", _missing_interpreter(program, path), errno_=code)
    if code == errno.ENOENT or (bare_name and code in _NOT_THERE_ERRNOS):
        return SpawnFailed("not_found", f"{program}: command not found", errno_=code)
    if code in _NOT_EXECUTABLE_ERRNOS:
        return SpawnFailed("not_executable", f"{program}: {e.strerror}", errno_=code)
    return SpawnFailed("other", f"cannot start {program!r}: {e}", errno_=code)


def _missing_interpreter(program: str, path: str) -> str:
    """What to say of a file exec could not run for want of another (ENOENT): the
    interpreter its ``#!`` line names (bash: "bad interpreter"), else its loader."""
    try:
        with open(path, "rb") as f:
            first = f.read(256).split(b"\n", 1)[0]
    except OSError:
        first = b""
    if first.startswith(b"#!") and first[2:].strip():
        interpreter = first[2:].strip().split()[0].decode("utf-8", "backslashreplace")
        return f"{program}: bad interpreter: {interpreter}: no such file or directory"
    return f"{program}: cannot execute: a file it needs (its loader) is not there"


def spawn(spec: SuperviseSpec) -> Child:
    """Start the task: its stdout and stderr two pipes (``stdout``/``stderr``), or with
    ``spec.pty`` one pseudo-terminal whose master is ``stdout`` (``stderr`` None)."""
    args = ["/bin/sh", "-c", *spec.argv] if spec.shell else list(spec.argv)
    env = {name: value for name, value in spec.env.items() if name}
    terminal = _open_pty() if spec.pty else None
    if terminal is None:
        (out_r, out_w), (err_r, err_w) = _pipes()
        ours, theirs = [out_r, err_r], [out_w, err_w]
    else:
        ours, theirs = [terminal[0]], [terminal[1], terminal[1]]
    try:
        pid = _spawn_in(spec.cwd, args, env, spec.stdin, theirs, spec.pass_fds)
    except BaseException:
        for fd in ours:
            os.close(fd)
        raise
    finally:
        # Only the task holds its ends: ours read EOF (a terminal's master EIO) once
        # it and its tree are gone.
        for fd in set(theirs):
            os.close(fd)
    streams = [os.fdopen(fd, "rb", buffering=0) for fd in ours]
    child = Child(pid, streams[0], streams[1] if len(streams) > 1 else None)
    for fd in ours if terminal is None else ():
        # Bigger pipes mean fewer wakeups and 1 MiB reads: the 1 GB throughput target.
        widen_pipe(fd, PIPE_BYTES)
    return child


def _pipes() -> tuple[tuple[int, int], tuple[int, int]]:
    out = os.pipe()
    try:
        return out, os.pipe()
    except OSError:
        os.close(out[0])
        os.close(out[1])
        raise


def _spawn_in(
    cwd: str, args: list[str], env: dict[str, str], stdin: int | None,
    outputs: list[int], pass_fds: tuple[int, ...],
) -> int:  # fmt: skip
    """``posix_spawn`` in ``cwd`` (entered and left), ``outputs`` its fd 1 and 2."""
    actions: list[tuple[int, ...]] = [] if stdin is None else [(os.POSIX_SPAWN_DUP2, stdin, 0)]
    actions += [(os.POSIX_SPAWN_DUP2, outputs[0], 1), (os.POSIX_SPAWN_DUP2, outputs[1], 2)]
    strays = _strays(pass_fds)
    try:
        here = os.open(".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        here = None  # (not even searchable, or EMFILE: we cannot go back)
    try:
        try:
            os.chdir(cwd)
        except OSError as e:
            message = f"cannot enter {cwd!r}: {e.strerror}"
            raise SpawnFailed("other", message, errno_=e.errno) from e
        try:
            lent = [fd for fd in pass_fds if not os.get_inheritable(fd)]
            try:
                for fd in lent:
                    os.set_inheritable(fd, True)
                for fd in strays:
                    os.set_inheritable(fd, False)
                return _spawn_found(args, env, actions)
            finally:
                for fd in lent:
                    os.set_inheritable(fd, False)
                for fd in strays:
                    os.set_inheritable(fd, True)
        except (OSError, ValueError) as e:
            raise spawn_failed(e, args[0]) from e
    finally:
        if here is not None:
            # (Made unsearchable meanwhile: we stay; a task started must not be lost.)
            with contextlib.suppress(OSError):
                os.fchdir(here)
            os.close(here)


def _spawn_found(args: list[str], env: dict[str, str], actions: list[tuple[int, ...]]) -> int:
    """``posix_spawn`` of ``args[0]`` where exec finds it: a name with a slash as it
    is; a bare name in each place on ``env``'s PATH where it is, in turn, until one
    starts. A place where it is not (ENOENT, ENOTDIR) is passed over, and so is one
    where its exec failed otherwise; the first such error is raised if none starts
    (one of a file whose ``#!`` interpreter is missing, ENOENT, only if no other),
    ENOENT if it is nowhere (as ``Popen`` and ``execvpe`` report them)."""
    program = args[0]
    if "/" in program:
        return _posix_spawn(program, args, env, actions)
    first_error: OSError | None = None
    no_interpreter: OSError | None = None
    # (os.get_exec_path(env) imports warnings: 0.3 ms of a supervisor's start.)
    for directory in env.get("PATH", os.defpath).split(os.pathsep):
        candidate = os.path.join(directory, program)
        try:
            os.stat(candidate)  # (a place without it costs no spawn; its errno is exec's)
        except OSError as e:
            if e.errno not in _NOT_THERE_ERRNOS and first_error is None:
                first_error = e
            continue
        try:
            return _posix_spawn(candidate, args, env, actions)
        except OSError as e:
            if e.errno == errno.ENOENT:  # (of a file that is there: its interpreter is not)
                no_interpreter = no_interpreter or e
            elif first_error is None:
                first_error = e
    error = first_error or no_interpreter
    if error is not None:
        raise error
    raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), program)


def _posix_spawn(
    path: str, args: list[str], env: dict[str, str], actions: list[tuple[int, ...]]
) -> int:
    return os.posix_spawn(
        path, args, env, file_actions=actions, setsid=True, setsigdef=_DEFAULT_IN_TASK
    )


def _strays(keep: tuple[int, ...]) -> list[int]:
    """Our descriptors above 2 without close-on-exec, ``keep`` aside."""
    strays = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2 and fd not in keep:
            with contextlib.suppress(OSError):  # (listdir's own, closed by now)
                if os.get_inheritable(fd):
                    strays.append(fd)
    return strays


def _open_pty() -> tuple[int, int]:
    """A pseudo-terminal (master, slave) for a task's output, both close-on-exec (the
    child gets the slave as its fd 1 and 2 only). Not the task's controlling terminal:
    nothing types into it, and a task whose supervisor dies is not sent SIGHUP.

    No output processing (OPOST off): the terminal would turn every "\\n" into "\\r\\n"
    (ONLCR) in the log; the bytes stay exactly as the task wrote them (ferry's own
    terminal translates them when they are shown).
    The window size is that of ferry's terminal, if it has one (tools fit their lines
    to it); otherwise the kernel's 0x0, which tools take for "unknown" (80 columns)."""
    import fcntl
    import termios

    try:
        master, slave = os.openpty()
    except OSError as e:
        raise SpawnFailed("other", f"cannot open a pseudo-terminal: {e}", errno_=e.errno) from e
    try:
        attrs = termios.tcgetattr(slave)
        attrs[1] &= ~termios.OPOST
        termios.tcsetattr(slave, termios.TCSANOW, attrs)
        for fd in (1, 2, 0):
            with contextlib.suppress(OSError):
                if os.isatty(fd):
                    size = fcntl.ioctl(fd, termios.TIOCGWINSZ, bytes(8))
                    fcntl.ioctl(slave, termios.TIOCSWINSZ, size)
                    break
    except (OSError, termios.error) as e:
        os.close(master)
        os.close(slave)
        raise SpawnFailed("other", f"cannot set up a pseudo-terminal: {e}") from e
    return master, slave


def kill_unsupervised(proc: Child, wait_s: float) -> None:
    # The leader is unreaped, so its number still names its group: killpg is safe.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(WaitTimeout):
        proc.wait(timeout=wait_s)
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()
