"""Shared by the hardening tests (test_bad_input, test_faults, test_security): the real
``ferry`` command, driven by :class:`clikit.Ferry` with a private FERRY_HOME and a work
directory of its own (:func:`cli_in`), and the checks of what a user and a script rely
on after an error: the exit code, one ``ferry: error[<code>]: ...`` line on stderr, no
traceback, and a state directory that is unchanged (:func:`tree`) or still valid; and
the faults themselves (small tmpfs mounts, read-only binds, a full filesystem).

No fixed sleeps: waits poll with a deadline. Every process a test starts is reaped, and
any process still carrying the test's FERRY_HOME in its environment is killed at the end.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from clikit import Ferry, wait_until

CALL_TIMEOUT_S = 120.0
DEADLINE_S = 30.0


def wait_for(condition: Callable[[], Any], what: str, deadline_s: float = DEADLINE_S) -> Any:
    """``clikit.wait_until`` with positional ``what`` (the older spelling, kept short)."""
    return wait_until(condition, what=what, timeout_s=deadline_s)


def pid_alive(pid: int) -> bool:
    """A process (not a zombie) has ``pid``."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return raw[raw.rfind(b")") + 2 :].split()[0] not in (b"Z", b"X")


def tree(home: Path) -> dict[str, tuple[int, str]]:
    """Every entry under ``home``: relative path -> (mode, content hash or link target)."""
    out: dict[str, tuple[int, str]] = {}
    for root, dirs, files in os.walk(home):
        for name in dirs + files:
            path = Path(root, name)
            st = path.lstat()
            if path.is_symlink():
                what = "-> " + os.readlink(path)
            elif path.is_file():
                what = hashlib.sha256(path.read_bytes()).hexdigest()
            else:
                what = "dir"
            out[str(path.relative_to(home))] = (st.st_mode, what)
    return out


@contextlib.contextmanager
def cli_in(tmp_path: Path, template: Path | None = None) -> Iterator[Ferry]:
    """A driver run from its own work directory, with commands bounded at
    CALL_TIMEOUT_S and background output to /dev/null, whose home is a copy of
    ``template`` (or fresh); closed afterwards."""
    home = tmp_path / "home"
    if template is not None:
        shutil.copytree(template, home, symlinks=True)
    workdir = tmp_path / "work"
    workdir.mkdir()
    cli = Ferry(home, workdir, timeout_s=CALL_TIMEOUT_S, start_stdout=subprocess.DEVNULL)
    try:
        yield cli
    finally:
        cli.close()


def make_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A state directory holding one SUCCEEDED, one FAILED and one QUEUED task."""
    base = tmp_path_factory.mktemp("template")
    with cli_in(base) as cli:
        cli.ok("run", "--name", "done", "--", "true")
        assert cli("run", "--name", "failed", "--", "false").code == 1
        cli.ok("submit", "--name", "queued", "--", "true")
        return cli.home


@contextlib.contextmanager
def mounted_tmpfs(where: Path, options: str) -> Iterator[Path]:
    """A tmpfs mounted at ``where`` (created if missing), always unmounted afterwards;
    the test is skipped where mounting is not permitted."""
    where.mkdir(mode=0o700, exist_ok=True)
    try:
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)],
            check=True,
            capture_output=True,
            timeout=30,
        )
    except (OSError, subprocess.CalledProcessError) as error:
        pytest.skip(f"cannot mount a tmpfs here: {error}")
    try:
        yield where
    finally:
        # Lazy: a process that still holds a file there must not keep the mount alive.
        subprocess.run(["umount", "-l", str(where)], check=False, capture_output=True, timeout=30)


@contextlib.contextmanager
def read_only_bind(where: Path) -> Iterator[Path]:
    """``where`` bind-mounted read-only over itself (skipped where not permitted)."""
    try:
        subprocess.run(
            ["mount", "--bind", str(where), str(where)], check=True, capture_output=True, timeout=30
        )
    except (OSError, subprocess.CalledProcessError) as error:
        pytest.skip(f"cannot bind-mount here: {error}")
    try:
        subprocess.run(
            ["mount", "-o", "remount,bind,ro", str(where)],
            check=True,
            capture_output=True,
            timeout=30,
        )
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False, capture_output=True, timeout=30)


def fill(directory: Path) -> Path:
    """Fill the filesystem of ``directory`` with a file until ENOSPC; returns the file."""
    path = directory / "filler"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for size in (1 << 20, 4096, 1):
            block = b"\0" * size
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, block)
    finally:
        os.close(fd)
    return path


# The SHA-256 of 4 GiB of NUL bytes: a pinned input that takes seconds to hash again.
ZEROS_4GIB_SHA256 = "8479e43911dc45e89f934fe48d01297e16f51d17aa561d4d1c216b1ae0fcddca"


def slow_to_hash(path: Path) -> str:
    """Make ``path`` 4 GiB of zeros (sparse: at once) and return it as ``--pointer``'s
    ``PATH=SHA256``: hashing it again takes seconds, a window to act in."""
    with path.open("wb") as f:
        f.truncate(4 << 30)
    return f"{path}={ZEROS_4GIB_SHA256}"


def holds_open(pid: int, path: Path) -> bool:
    """Has process ``pid`` a descriptor open on ``path`` (it is reading it)?"""
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{pid}/fd/{fd}") == str(path):
                    return True
    return False


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (a launcher's supervisors)."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError, ValueError):
                stat = Path(f"/proc/{name}/stat").read_bytes()
                if int(stat.rsplit(b")", 1)[1].split()[1]) == pid:
                    found.append(int(name))
    return found


def holds_open_below(pid: int, path: Path) -> bool:
    """Does ``pid``, or one of its children (ferry's supervisors), hold ``path`` open?"""
    return any(holds_open(p, path) for p in (pid, *children(pid)))
