"""Shared by the hardening tests (test_bad_input, test_faults, test_security): drive the
real ``ferry`` command in a subprocess with a private FERRY_HOME and check what a user
and a script rely on after an error: the exit code, one ``ferry: error[<code>]: ...``
line on stderr, no traceback, and a state directory that is unchanged or still valid.

No fixed sleeps: waits poll with a deadline. Every process a test starts is reaped, and
any process still carrying the test's FERRY_HOME in its environment is killed at the end.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

FERRY = [sys.executable, "-m", "ferry.cli"]
CALL_TIMEOUT_S = 120.0
DEADLINE_S = 30.0
ERROR_LINE = re.compile(r"^ferry: error\[([a-z_]+(?:\.[A-Za-z_]+)*)\]: \S.*$")


@dataclass
class Result:
    code: int
    out: bytes
    err: str

    @property
    def text(self) -> str:
        return self.out.decode("utf-8", "replace")

    def json(self) -> Any:
        return json.loads(self.out)

    def error_code(self) -> str:
        """The code of the one error line on stderr (the last line: a task's own stderr
        may come before it)."""
        lines = self.err.splitlines()
        assert lines, f"no error line on stderr (exit {self.code})"
        match = ERROR_LINE.match(lines[-1])
        assert match is not None, f"not a coded error line: {lines[-1]!r}"
        assert sum(1 for line in lines if line.startswith("ferry: error[")) == 1, self.err
        return match.group(1)


def wait_for(condition: Callable[[], Any], what: str, deadline_s: float = DEADLINE_S) -> Any:
    end = time.monotonic() + deadline_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def processes_with_env(needle: bytes) -> list[int]:
    """Live (non-zombie) processes whose environment holds ``needle`` as a variable."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            environ = Path(f"/proc/{name}/environ").read_bytes()
            raw = Path(f"/proc/{name}/stat").read_bytes()
        except OSError:
            continue
        if raw[raw.rfind(b")") + 2 :].split()[0] in (b"Z", b"X"):
            continue
        if needle in environ.split(b"\0"):
            found.append(int(name))
    return found


def pid_alive(pid: int) -> bool:
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


class Cli:
    """The ferry command with a private FERRY_HOME, run from ``workdir``."""

    def __init__(self, home: Path, workdir: Path) -> None:
        self.home = home
        self.workdir = workdir
        self.env = {
            k: v for k, v in os.environ.items() if k not in ("FERRY_FAILPOINTS", "FERRY_DEBUG")
        }
        self.env["FERRY_HOME"] = str(home)
        self.background: list[subprocess.Popen[bytes]] = []

    def __call__(
        self,
        *args: str | bytes,
        stdin: bytes | int | None = None,
        prefix: list[str] | None = None,
        preexec: Callable[[], None] | None = None,
        extra_env: Mapping[str, str] | None = None,
    ) -> Result:
        env = {**self.env, **(extra_env or {})}
        feed = stdin if isinstance(stdin, bytes) else None
        source: int | None = None
        if feed is None:
            source = stdin if isinstance(stdin, int) else subprocess.DEVNULL
        proc = subprocess.run(
            [*(prefix or FERRY), *args],
            input=feed,
            stdin=source,
            capture_output=True,
            env=env,
            cwd=self.workdir,
            timeout=CALL_TIMEOUT_S,
            check=False,
            preexec_fn=preexec,
        )
        err = proc.stderr.decode("utf-8", "replace")
        assert "Traceback" not in err, err
        assert b"Traceback" not in proc.stdout
        return Result(proc.returncode, proc.stdout, err)

    def ok(self, *args: str) -> Result:
        result = self(*args)
        assert result.code == 0, (args, result)
        return result

    def json(self, *args: str) -> Any:
        return self.ok("--json", *args).json()

    def start(self, *args: str) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            [*FERRY, *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=self.env,
            cwd=self.workdir,
            start_new_session=True,
        )
        self.background.append(proc)
        return proc

    def tasks(self) -> list[dict[str, Any]]:
        tasks: list[dict[str, Any]] = self.json("ls", "--limit", "0")
        return tasks

    def task(self, task_id: str) -> dict[str, Any]:
        task: dict[str, Any] = self.json("show", task_id)
        return task

    def records(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.ok("--json", "journal", "dump").out.splitlines()]

    def verify_clean(self) -> dict[str, Any]:
        """``journal verify`` exits 0 and reports a clean journal."""
        report: dict[str, Any] = self.json("journal", "verify")
        assert report["status"] == "clean", report
        return report

    def refused(self, exit_code: int, code: str, *args: str | bytes, **kw: Any) -> Result:
        """Run a command that must fail: ``exit_code``, a coded line whose code is
        ``code`` (or starts with it when ``code`` ends in '.'), no traceback."""
        result = self(*args, **kw)
        assert result.code == exit_code, (args, result)
        got = result.error_code()
        assert got == code or (code.endswith(".") and got.startswith(code)), (got, result.err)
        return result

    def cleanup(self) -> None:
        for proc in self.background:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=CALL_TIMEOUT_S)
            if proc.stderr is not None:
                proc.stderr.close()
        for pid in processes_with_env(f"FERRY_HOME={self.home}".encode()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def cli_in(tmp_path: Path, template: Path | None = None) -> Iterator[Cli]:
    """A Cli whose home is a copy of ``template`` (or fresh), cleaned up afterwards."""
    home = tmp_path / "home"
    if template is not None:
        shutil.copytree(template, home, symlinks=True)
    workdir = tmp_path / "work"
    workdir.mkdir()
    cli = Cli(home, workdir)
    try:
        yield cli
    finally:
        cli.cleanup()


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
