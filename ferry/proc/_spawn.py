"""Start one task's command in a new session, and name why it could not start.

``subprocess.Popen`` reports a failed exec in the parent (through its close-on-exec
error pipe), so the kind of failure is known before ``supervise`` returns: the exit
codes 127/126 of the contract, as a shell would choose them.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess

from ferry.core.errors import EX_FERRY_FAILED, EX_NOT_EXECUTABLE, EX_NOT_FOUND_CMD, SpawnError
from ferry.proc._sink import widen_pipe
from ferry.proc._supervise_types import SuperviseSpec

PIPE_BYTES = 1 << 20  # the unprivileged maximum (/proc/sys/fs/pipe-max-size) by default

_KIND_EXIT = {"not_found": EX_NOT_FOUND_CMD, "not_executable": EX_NOT_EXECUTABLE}
_NOT_EXECUTABLE_ERRNOS = frozenset(
    {errno.EACCES, errno.EPERM, errno.ENOEXEC, errno.EISDIR, errno.ENOTDIR, errno.ETXTBSY}
)


class SpawnFailed(SpawnError):
    """The command could not be started. ``kind``: not_found (127), not_executable
    (126, a directory too), other (125: a bad cwd, fork failure, E2BIG...)."""

    def __init__(self, kind: str, message: str, *, errno_: int | None = None) -> None:
        super().__init__(
            message,
            code=f"spawn.{kind}",
            details={"kind": kind, "errno": errno_},
            exit_code=_KIND_EXIT.get(kind, EX_FERRY_FAILED),
        )
        self.kind = kind
        self.errno = errno_


def spawn_failed(e: OSError | ValueError, spec: SuperviseSpec, program: str) -> SpawnFailed:
    if isinstance(e, ValueError):  # an env key with "=" or a NUL byte somewhere
        return SpawnFailed("other", f"cannot start {program!r}: {e}")
    code = e.errno
    filename = None if e.filename is None else os.fspath(e.filename)
    # subprocess names the cwd when chdir failed, the program when exec did; when they
    # are the same string, whether the directory can be entered tells them apart.
    chdir_failed = filename == spec.cwd and (
        filename != program or not (os.path.isdir(filename) and os.access(filename, os.X_OK))
    )
    if chdir_failed:
        return SpawnFailed("other", f"cannot enter {spec.cwd!r}: {e.strerror}", errno_=code)
    bare_name = "/" not in program
    if code == errno.ENOENT or (bare_name and code == errno.ENOTDIR):
        return SpawnFailed("not_found", f"{program}: command not found", errno_=code)
    if code in _NOT_EXECUTABLE_ERRNOS:
        return SpawnFailed("not_executable", f"{program}: {e.strerror}", errno_=code)
    return SpawnFailed("other", f"cannot start {program!r}: {e}", errno_=code)


def spawn(spec: SuperviseSpec) -> subprocess.Popen[bytes]:
    """Start the task: its stdout and stderr two pipes (``proc.stdout``/``proc.stderr``),
    or with ``spec.pty`` one pseudo-terminal whose master is ``proc.stdout`` (and
    ``proc.stderr`` None)."""
    args = ["/bin/sh", "-c", *spec.argv] if spec.shell else list(spec.argv)
    terminal = _open_pty() if spec.pty else None
    outputs: int | None = subprocess.PIPE if terminal is None else terminal[1]
    try:
        proc = subprocess.Popen(
            args,
            cwd=spec.cwd,
            env=dict(spec.env),
            stdin=spec.stdin,
            stdout=outputs,
            stderr=outputs,
            start_new_session=True,  # its own session and group: signals reach the tree
            close_fds=True,
            pass_fds=spec.pass_fds,
            bufsize=0,
        )
    except (OSError, ValueError) as e:
        if terminal is not None:
            os.close(terminal[0])
        raise spawn_failed(e, spec, args[0]) from e
    finally:
        if terminal is not None:
            # Only the task holds the terminal: the master reads EIO once it is gone.
            os.close(terminal[1])
    if terminal is not None:
        proc.stdout = os.fdopen(terminal[0], "rb", buffering=0)
    else:
        _widen_pipes(proc)
    return proc


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


def _widen_pipes(proc: subprocess.Popen[bytes]) -> None:
    # Bigger pipes mean fewer wakeups and 1 MiB reads: the 1 GB throughput target.
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            widen_pipe(stream.fileno(), PIPE_BYTES)


def kill_unsupervised(proc: subprocess.Popen[bytes], wait_s: float) -> None:
    # The leader is unreaped, so its number still names its group: killpg is safe.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=wait_s)
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()
