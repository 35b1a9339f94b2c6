"""The installed ``ferry`` command, driven as a user would drive it.

A fresh virtual environment is built in a temporary directory and ferry is installed in
it with plain ``pip install <source>`` (dependencies from the environment's package
index). The source is a copy of the project's packaging files and packages, so that
pip's in-tree build leaves nothing behind in the work tree. Building takes ~15 s here;
the module builds it once.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
INSTALL_TIMEOUT_S = 600.0
CALL_TIMEOUT_S = 60.0
_SOURCES = ("pyproject.toml", "README.md", "LICENSE", "ferry", "journal")

pytestmark = pytest.mark.timeout(900)


class Installed:
    def __init__(self, venv: Path) -> None:
        self.venv = venv
        self.bin = venv / "bin"
        self.ferry = self.bin / "ferry"
        self.python = self.bin / "python"

    def env(self, home: Path) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("FERRY_", "VIRTUAL_ENV"))}
        env["PATH"] = f"{self.bin}{os.pathsep}{env.get('PATH', '')}"
        env["FERRY_HOME"] = str(home)
        env.pop("PYTHONPATH", None)
        return env

    def run(self, args: list[str], home: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            args, env=self.env(home), cwd=cwd, capture_output=True, text=True,
            timeout=CALL_TIMEOUT_S, check=False, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        assert "Traceback" not in proc.stderr, proc.stderr
        return proc


def _copy_sources(dest: Path) -> Path:
    source = dest / "ferry-src"
    source.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name in _SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, source / name, ignore=ignore)
        elif path.exists():
            shutil.copy2(path, source / name)
    return source


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    base = tmp_path_factory.mktemp("installed")
    source = _copy_sources(base)
    venv = base / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", str(venv)], check=True, timeout=INSTALL_TIMEOUT_S,
        capture_output=True,
    )  # fmt: skip
    pip = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", str(source)],
        capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, check=False, cwd=base,
    )  # fmt: skip
    assert pip.returncode == 0, f"pip install failed:\n{pip.stdout[-3000:]}\n{pip.stderr[-3000:]}"
    yield Installed(venv)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "state" / "ferry"


def test_the_installed_package_is_not_the_work_tree(
    installed: Installed, home: Path, tmp_path: Path
) -> None:
    where = installed.run(
        [str(installed.python), "-c", "import ferry, journal; print(ferry.__file__); print(journal.__file__)"],
        home, tmp_path,
    )  # fmt: skip
    assert where.returncode == 0, where.stderr
    for line in where.stdout.splitlines():
        assert Path(line).is_relative_to(installed.venv), line
    assert installed.ferry.exists()


def test_the_readme_command(installed: Installed, home: Path, tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    line = next(text for text in readme.splitlines() if "ferry run --name hello" in text)
    command = line[line.index("ferry run --name hello") :].strip()
    assert command == "ferry run --name hello -- echo hello from ferry && ferry ls"
    result = installed.run(["/bin/sh", "-c", command], home, tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "hello from ferry"
    assert lines[1].split()[:3] == ["#", "ID", "STATE"]
    row = lines[2].split()
    assert row[2] == "SUCCEEDED" and row[-1] == "hello"
    assert len(lines) == 3
    assert home.is_dir() and (home.stat().st_mode & 0o777) == 0o700


def test_version(installed: Installed, home: Path, tmp_path: Path) -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    result = installed.run([str(installed.ferry), "--version"], home, tmp_path)
    assert result.returncode == 0
    assert result.stdout.strip() == f"ferry {pyproject['project']['version']}"
    by_module = installed.run(
        [str(installed.python), "-m", "ferry.cli", "--version"], home, tmp_path
    )
    assert by_module.stdout == result.stdout


def _commands(help_text: str) -> list[str]:
    section = help_text.split("Commands:", 1)[1]
    return [m[1] for m in re.finditer(r"^  ([a-z][a-z-]*)\s", section, flags=re.MULTILINE)]


def test_every_command_help_shows_an_example(
    installed: Installed, home: Path, tmp_path: Path
) -> None:
    top = installed.run([str(installed.ferry), "--help"], home, tmp_path)
    assert top.returncode == 0 and "Example" in top.stdout
    commands = _commands(top.stdout)
    expected = {"run", "submit", "claim", "work", "recover", "ls", "show", "logs",
                "lease", "cancel", "retry", "kill", "journal"}  # fmt: skip
    assert expected <= set(commands), commands
    paths = [[name] for name in commands]
    journal = installed.run([str(installed.ferry), "journal", "--help"], home, tmp_path)
    paths += [["journal", name] for name in _commands(journal.stdout)]
    assert ["journal", "verify"] in paths and ["journal", "dump"] in paths
    for path in paths:
        shown = installed.run([str(installed.ferry), *path, "--help"], home, tmp_path)
        assert shown.returncode == 0, (path, shown.stderr)
        assert "Example" in shown.stdout, f"ferry {' '.join(path)} --help has no example"
        assert shown.stdout.startswith(f"Usage: ferry {' '.join(path)} ")
    assert not home.exists(), "--help must not create the state directory"


def test_exit_status_and_logs_through_the_installed_command(
    installed: Installed, home: Path, tmp_path: Path
) -> None:
    ferry = str(installed.ferry)
    failed = installed.run(
        [ferry, "run", "--", "sh", "-c", "echo out; echo err >&2; exit 7"], home, tmp_path
    )
    assert failed.returncode == 7
    listed = installed.run([ferry, "--json", "ls"], home, tmp_path)
    assert '"state":"FAILED"' in listed.stdout
    task_id = listed.stdout.split('"id":"', 1)[1][:16]
    # The task's output passes through; then run's one line on what became of it.
    assert failed.stdout == "out\n"
    assert failed.stderr == f"err\nferry: task #1 {task_id} failed: EXIT_NONZERO (exit 7)\n"
    logs = installed.run([ferry, "logs", task_id[:12]], home, tmp_path)
    assert (logs.returncode, logs.stdout, logs.stderr) == (0, "out\n", "err\n")
    missing = installed.run([ferry, "run", "--", "ferry-no-such-command"], home, tmp_path)
    assert missing.returncode == 127
    assert missing.stderr.startswith("ferry: error[spawn.not_found]")


def test_gc_and_log_max_through_the_installed_command(
    installed: Installed, home: Path, tmp_path: Path
) -> None:
    """Issue 18: a task's log capped with --log-max (the passthrough whole, about the cap
    on disk, the evidence), then ``ferry gc`` forgets it and frees its log."""
    ferry = str(installed.ferry)
    writer = "head -c 3000000 /dev/zero | tr '\\0' a"
    run = installed.run([ferry, "run", "--log-max", "64K", "--shell", "--", writer], home, tmp_path)
    assert run.returncode == 0 and run.stdout == "a" * 3_000_000, run.stderr
    shown = installed.run([ferry, "--json", "show", "last"], home, tmp_path)
    assert '"log_dropped_bytes":{"stderr":0,"stdout":' in shown.stdout
    task_id = shown.stdout.split('"id":"', 1)[1][:16]
    log = home / "logs" / task_id / "1.stdout"
    assert log.stat().st_blocks * 512 <= (64 << 10) + 8192
    logs = installed.run([ferry, "logs", "last"], home, tmp_path)
    assert logs.stdout.startswith("a" * 32768) and "not kept here (--log-max)" in logs.stderr

    plan = installed.run([ferry, "gc", "--older-than", "0s", "--dry-run"], home, tmp_path)
    assert plan.returncode == 0 and plan.stdout.startswith("would forget 1 task (1 SUCCEEDED)")
    assert log.exists()
    done = installed.run([ferry, "gc", "--older-than", "0s"], home, tmp_path)
    assert done.returncode == 0 and done.stdout.startswith("forgot 1 task (1 SUCCEEDED)")
    assert not log.parent.exists()
    assert installed.run([ferry, "ls"], home, tmp_path).stdout == ""
    verify = installed.run([ferry, "journal", "verify"], home, tmp_path)
    assert verify.returncode == 0, verify.stdout
    bad = installed.run([ferry, "gc", "--older-than", "a week"], home, tmp_path)
    assert bad.returncode == 2 and bad.stderr.startswith("ferry: error[usage.bad_duration]")
