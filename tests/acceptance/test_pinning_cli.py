"""Pointers and the self-contained patch mode, end to end through the installed ``ferry``
command: a stale pointer never runs the command; a stale pointer with a valid patch runs
in self-contained mode with its environment and evidence; fresh pointers run normally
with the verified hashes recorded; a patch failing a gate is refused up front."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.timeout(120)

OLD = b"export const add = (a: number, b: number) => a - b;\n"
NEW = b"export const add = (a: number, b: number) => a + b;\n"
UTIL = b"export const id = <T>(x: T) => x;\n"
PATCH = (
    b"diff --git a/calc.ts b/calc.ts\n"
    b"--- a/calc.ts\n"
    b"+++ b/calc.ts\n"
    b"@@ -1 +1 @@\n"
    b"-export const add = (a: number, b: number) => a - b;\n"
    b"+export const add = (a: number, b: number) => a + b;\n"
    b"diff --git a/src/util.ts b/src/util.ts\n"
    b"--- a/src/util.ts\n"
    b"+++ b/src/util.ts\n"
    b"@@ -1 +1,2 @@\n"
    b" export const id = <T>(x: T) => x;\n"
    b"+export const two = 2;\n"
)
# The child records that it ran and what ferry told it.
CHILD = (
    "import json, os; "
    "json.dump({k: v for k, v in os.environ.items() if k.startswith('FERRY_PATCH')}, "
    "open('ran.json', 'w'))"
)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def ferry_command() -> list[str]:
    installed = Path(sys.executable).parent / "ferry"
    if installed.exists():
        return [str(installed)]
    found = shutil.which("ferry")
    return [found] if found else [sys.executable, "-m", "ferry.cli"]


class Ferry:
    def __init__(self, home: Path, cwd: Path) -> None:
        self.home = home
        self.cwd = cwd

    def __call__(self, *args: str, home_option: bool = False) -> subprocess.CompletedProcess[str]:
        """Run ferry with FERRY_HOME set, or with ``--home`` when ``home_option``."""
        env = {**os.environ, "FERRY_HOME": str(self.home)}
        global_options = ["--home", str(self.home)] if home_option else []
        if home_option:
            del env["FERRY_HOME"]
        return subprocess.run(
            [*ferry_command(), *global_options, *args],
            cwd=self.cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    def only_task(self) -> dict[str, Any]:
        listed = self("--json", "ls", "--limit", "0")
        assert listed.returncode == 0, listed.stderr
        tasks = json.loads(listed.stdout)
        assert len(tasks) == 1
        task: dict[str, Any] = tasks[0]
        return task


@pytest.fixture
def work(tmp_path: Path) -> Path:
    directory = tmp_path / "work"
    (directory / "src").mkdir(parents=True)
    (directory / "calc.ts").write_bytes(OLD)
    (directory / "src" / "util.ts").write_bytes(UTIL)
    (directory / "review.diff").write_bytes(PATCH)
    return directory


@pytest.fixture
def ferry(tmp_path: Path, work: Path) -> Ferry:
    return Ferry(tmp_path / "home", work)


def child_ran(work: Path) -> dict[str, str] | None:
    marker = work / "ran.json"
    if not marker.exists():
        return None
    env: dict[str, str] = json.loads(marker.read_text())
    return env


def test_fresh_pointers_run_normally_with_verified_hashes(ferry: Ferry, work: Path) -> None:
    done = ferry(
        "run",
        "--pointer",
        "calc.ts",
        "--pointer",
        "./src/util.ts",
        "--",
        sys.executable,
        "-c",
        CHILD,
    )
    assert done.returncode == 0, done.stderr
    assert child_ran(work) == {}  # no FERRY_PATCH_* in normal mode
    task = ferry.only_task()
    assert task["state"] == "SUCCEEDED"
    assert task["evidence"]["patch_mode"] == "NONE"
    assert task["evidence"]["verified_sha256"] == {"calc.ts": sha(OLD), "src/util.ts": sha(UTIL)}


def test_stale_pointer_without_a_patch_never_runs_the_command(ferry: Ferry, work: Path) -> None:
    submitted = ferry("submit", "--pointer", "calc.ts", "--", sys.executable, "-c", CHILD)
    assert submitted.returncode == 0, submitted.stderr
    (work / "calc.ts").write_bytes(NEW)
    drained = ferry("work", "--drain")
    assert drained.returncode == 1, drained.stderr  # (the task it settled FAILED)
    assert child_ran(work) is None
    task = ferry.only_task()
    assert (task["state"], task["reason"]) == ("FAILED", "POINTER_STALE")
    assert task["evidence"]["stale_pointers"] == {
        "calc.ts": {"expected": sha(OLD), "actual": sha(NEW)}
    }
    assert task["evidence"]["verified_sha256"] == {}


def test_run_with_a_stale_declared_hash_exits_125_without_running(ferry: Ferry, work: Path) -> None:
    done = ferry(
        "run", "--pointer", f"calc.ts={sha(b'planned version')}", "--", sys.executable, "-c", CHILD
    )
    assert done.returncode == 125
    assert "error[pointer.stale]" in done.stderr
    assert child_ran(work) is None
    assert ferry.only_task()["reason"] == "POINTER_STALE"


def test_stale_pointer_with_a_patch_but_not_idempotent_never_runs(ferry: Ferry, work: Path) -> None:
    args = ["--pointer", f"calc.ts={sha(OLD)}", "--pointer", "src/util.ts"]
    (work / "calc.ts").write_bytes(NEW)
    done = ferry("run", *args, "--patch-file", "review.diff", "--", sys.executable, "-c", CHILD)
    assert done.returncode == 125
    assert child_ran(work) is None
    assert ferry.only_task()["reason"] == "POINTER_STALE"


def test_stale_pointer_with_a_valid_patch_runs_self_contained(ferry: Ferry, work: Path) -> None:
    submitted = ferry(
        "submit", "--idempotent", "--pointer", "calc.ts", "--pointer", "src/util.ts",
        "--patch-file", "review.diff", "--", sys.executable, "-c", CHILD,
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    (work / "calc.ts").write_bytes(NEW)  # the checkout moved on after submit
    (work / "review.diff").write_bytes(b"edited after submit: ferry uses its own copy\n")

    drained = ferry("work", "--drain")
    assert drained.returncode == 0, drained.stderr
    assert "NOT the reviewed version" in drained.stderr

    env = child_ran(work)
    assert env is not None
    assert env["FERRY_PATCH_MODE"] == "SELF_CONTAINED"
    assert Path(env["FERRY_PATCH_FILE"]).read_bytes() == PATCH
    assert Path(env["FERRY_PATCH_FILE"]).stat().st_mode & 0o777 == 0o600
    task = ferry.only_task()
    assert task["state"] == "SUCCEEDED"
    evidence = task["evidence"]
    assert evidence["patch_mode"] == "SELF_CONTAINED"
    assert evidence["patch_sha256"] == sha(PATCH)
    assert evidence["verified_on_disk"] is False
    assert evidence["unverified_pointers"] == ["calc.ts"]
    # Only what was checked on disk: util.ts; never calc.ts's recorded hash.
    assert evidence["verified_sha256"] == {"src/util.ts": sha(UTIL)}


@pytest.mark.parametrize(
    ("patch", "code"),
    [
        (b"I reviewed calc.ts and it looks fine to me, ship.", "patch.NOT_A_UNIFIED_DIFF"),
        (
            b"--- a/README.md\n+++ b/README.md\n@@ -1 +1 @@\n-A calculator.\n+A small calculator.\n",
            "patch.PATCH_DOES_NOT_COVER_POINTERS",
        ),
        (b"--- a/calc.ts\n+++ b/calc.ts\n", "patch.EMPTY_PATCH_HUNKS"),
    ],
    ids=["49-bytes-of-prose", "readme-for-calc", "header-only"],
)
def test_a_patch_failing_a_gate_is_refused_up_front(
    ferry: Ferry, work: Path, patch: bytes, code: str
) -> None:
    (work / "bad.diff").write_bytes(patch)
    args = ["--idempotent", "--pointer", "calc.ts", "--patch-file", "bad.diff"]
    submitted = ferry("submit", *args, "--", sys.executable, "-c", CHILD)
    assert submitted.returncode == 2
    assert f"error[{code}]" in submitted.stderr
    ran = ferry("run", *args, "--", sys.executable, "-c", CHILD)
    assert ran.returncode == 125
    assert f"error[{code}]" in ran.stderr
    assert child_ran(work) is None
    listed = ferry("--json", "ls", "--limit", "0")
    assert json.loads(listed.stdout) == []


def test_run_exit_code_for_a_gate_failure_with_the_global_home_option(
    ferry: Ferry, work: Path
) -> None:
    # The same refusal when the state directory comes from --home instead of FERRY_HOME:
    # ``run`` must still be recognised as the command (exit 125, not submit's 2).
    (work / "bad.diff").write_bytes(b"--- a/calc.ts\n+++ b/calc.ts\n")
    args = ["--idempotent", "--pointer", "calc.ts", "--patch-file", "bad.diff"]
    ran = ferry("run", *args, "--", sys.executable, "-c", CHILD, home_option=True)
    assert "error[patch.EMPTY_PATCH_HUNKS]" in ran.stderr
    assert ran.returncode == 125
