"""Pointers: parse, resolve, hash, re-check; the dispatch decision table; the private
patch copy (permissions, atomicity)."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from ferry.app.pointers import (
    check_before_dispatch,
    hash_file,
    pointers_from_spec,
    prepare_patch,
    recheck,
    resolve_pointer,
    resolve_pointers,
    store_patch,
    store_patch_bytes,
)
from ferry.core.errors import EX_FERRY_FAILED, EX_USAGE, PatchGateError, UsageError, exit_code_for
from ferry.core.model import Reason
from ferry.core.pinning import (
    ENV_PATCH_FILE,
    ENV_PATCH_MODE,
    PATCH_MODE_NONE,
    PATCH_MODE_SELF_CONTAINED,
    POINTER_STALE,
    DispatchVerdict,
    Pointer,
    PointerCheck,
    PointerObservation,
    StoredPatch,
    decide_dispatch,
)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def diff_of(*paths: str) -> bytes:
    return b"".join(f"--- a/{p}\n+++ b/{p}\n@@ -1 +1 @@\n-old\n+new\n".encode() for p in paths)


@pytest.fixture
def task_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "task"
    directory.mkdir()
    (directory / "calc.ts").write_bytes(b"export const one = 1;\n")
    (directory / "src").mkdir()
    (directory / "src" / "util.ts").write_bytes(b"export {};\n")
    return directory


def usage_error(arg: str, cwd: Path) -> UsageError:
    with pytest.raises(UsageError) as caught:
        resolve_pointer(arg, cwd)
    assert caught.value.exit_code == EX_USAGE
    return caught.value


# ---- parse, resolve, hash --------------------------------------------------------------


def test_relative_pointer_resolves_against_the_task_cwd_not_ours(task_dir: Path) -> None:
    assert Path.cwd() != task_dir
    pointer = resolve_pointer("calc.ts", task_dir)
    assert pointer.path == "calc.ts"
    assert pointer.abs_path == str(task_dir / "calc.ts")
    assert pointer.sha256 == sha(b"export const one = 1;\n")


@pytest.mark.parametrize("arg", ["./calc.ts", "src/../calc.ts", ".//calc.ts"])
def test_pointer_paths_are_normalised(task_dir: Path, arg: str) -> None:
    assert resolve_pointer(arg, task_dir).path == "calc.ts"


def test_absolute_pointer_is_stored_relative_to_the_cwd(task_dir: Path) -> None:
    assert resolve_pointer(str(task_dir / "src" / "util.ts"), task_dir).path == "src/util.ts"
    outside = resolve_pointer(str(task_dir / "calc.ts"), task_dir / "src")
    assert outside.path == "../calc.ts"
    assert outside.abs_path == str(task_dir / "calc.ts")


def test_declared_hash_is_taken_as_given_and_the_file_not_read(task_dir: Path) -> None:
    declared = "AB" * 32
    pointer = resolve_pointer(f"not-there-yet.ts={declared}", task_dir)
    assert pointer.sha256 == declared.lower()
    assert pointer.path == "not-there-yet.ts"


def test_a_path_with_equals_needs_an_explicit_hash(task_dir: Path) -> None:
    (task_dir / "a=b").write_bytes(b"x")
    assert usage_error("a=b", task_dir).code == "usage.bad_pointer"
    assert resolve_pointer(f"a=b={'0' * 64}", task_dir).path == "a=b"


@pytest.mark.parametrize(
    "arg",
    ["calc.ts=" + "0" * 63, "calc.ts=" + "g" * 64, "calc.ts=", "=" + "0" * 64, "", "x\0y"],
    ids=["short-hash", "not-hex", "empty-hash", "empty-path", "empty", "nul"],
)
def test_bad_pointers_are_usage_errors(task_dir: Path, arg: str) -> None:
    assert usage_error(arg, task_dir).code == "usage.bad_pointer"


def test_missing_file_at_submit(task_dir: Path) -> None:
    error = usage_error("nope.ts", task_dir)
    assert error.code == "usage.pointer_missing"
    assert "nope.ts" in error.message


def test_directory_is_not_pinnable(task_dir: Path) -> None:
    assert usage_error("src", task_dir).code == "usage.pointer_unreadable"


@pytest.mark.timeout(10)
def test_fifo_is_refused_without_hanging(task_dir: Path) -> None:
    os.mkfifo(task_dir / "pipe")
    assert usage_error("pipe", task_dir).code == "usage.pointer_unreadable"


def test_non_utf8_path_is_refused(task_dir: Path) -> None:
    name = b"caf\xe9.ts".decode("utf-8", "surrogateescape")
    (task_dir / name).write_bytes(b"x")
    error = usage_error(name, task_dir)
    assert error.code == "usage.bad_pointer"
    orjson.dumps(error.to_json())


def test_resolve_pointers_merges_repeats_and_refuses_conflicts(task_dir: Path) -> None:
    pointers = resolve_pointers(["calc.ts", "./calc.ts", "src/util.ts"], task_dir)
    assert [p.path for p in pointers] == ["calc.ts", "src/util.ts"]
    with pytest.raises(UsageError) as caught:
        resolve_pointers(["calc.ts", f"calc.ts={'0' * 64}"], task_dir)
    assert caught.value.code == "usage.bad_pointer"


def test_spec_entries_round_trip(task_dir: Path) -> None:
    pointers = resolve_pointers(["calc.ts", "src/util.ts"], task_dir)
    entries = [p.spec_entry() for p in pointers]
    assert pointers_from_spec(entries, str(task_dir)) == pointers


def test_hash_file_matches_hashlib_across_chunks(tmp_path: Path) -> None:
    data = os.urandom(3 * 1024 * 1024 + 17)
    (tmp_path / "big").write_bytes(data)
    assert hash_file(tmp_path / "big") == sha(data)
    (tmp_path / "empty").write_bytes(b"")
    assert hash_file(tmp_path / "empty") == sha(b"")


# ---- re-check before dispatch ----------------------------------------------------------


def test_recheck_sees_fresh_changed_missing_and_unreadable(task_dir: Path) -> None:
    (task_dir / "gone.ts").write_bytes(b"soon gone\n")
    (task_dir / "dir.ts").write_bytes(b"becomes a directory\n")
    pointers = resolve_pointers(["calc.ts", "src/util.ts", "gone.ts", "dir.ts"], task_dir)
    (task_dir / "src" / "util.ts").write_bytes(b"export const changed = true;\n")
    (task_dir / "gone.ts").unlink()
    (task_dir / "dir.ts").unlink()
    (task_dir / "dir.ts").mkdir()

    check = recheck(pointers)

    assert [o.pointer.path for o in check.fresh] == ["calc.ts"]
    assert check.fresh[0].actual_sha256 == sha(b"export const one = 1;\n")
    by_path = {o.pointer.path: o for o in check.stale}
    assert by_path["src/util.ts"].actual_sha256 == sha(b"export const changed = true;\n")
    assert (by_path["gone.ts"].actual_sha256, by_path["gone.ts"].problem) == (None, "missing")
    assert by_path["dir.ts"].actual_sha256 is None
    assert by_path["dir.ts"].problem is not None
    assert by_path["dir.ts"].problem.startswith("unreadable")


def test_declared_hash_that_does_not_match_disk_is_stale(task_dir: Path) -> None:
    pointers = resolve_pointers([f"calc.ts={'0' * 64}"], task_dir)
    check = recheck(pointers)
    assert not check.fresh
    assert check.stale[0].actual_sha256 == sha(b"export const one = 1;\n")


# ---- the decision table (pure) ---------------------------------------------------------

A, B = "calc.ts", "src/util.ts"
HASH = {name: sha(name.encode()) for name in ("A0", "A1", "B0", "B1")}
PATCH_COPY = "/state/patches/copy.patch"


def observe(
    path: str, expected: str, actual: str | None, problem: str | None = None
) -> PointerObservation:
    pointer = Pointer(path=path, abs_path=f"/task/{path}", sha256=HASH[expected])
    return PointerObservation(pointer, None if actual is None else HASH[actual], problem)


def decide(
    observations: list[PointerObservation],
    *,
    idempotent: bool,
    patch: bytes | None = None,
    copy: bytes | None = None,
) -> DispatchVerdict:
    """``patch`` is what was stored at submit; ``copy`` what is read now (default: same)."""
    stored = None if patch is None else StoredPatch(path=PATCH_COPY, sha256=sha(patch))
    read_now = patch if copy is None else copy
    verdict = decide_dispatch(
        PointerCheck(tuple(observations)), idempotent=idempotent, patch=stored, patch_bytes=read_now
    )
    orjson.dumps(verdict.evidence)  # the evidence goes into the journal as JSON
    if verdict.run:
        assert verdict.error() is None
        assert verdict.reason is None
    else:
        assert verdict.env == {}
        assert verdict.reason in {reason.value for reason in Reason}
        error = verdict.error()
        assert error is not None
        assert exit_code_for(error, runs_task=True) == EX_FERRY_FAILED
    for path, digest in verdict.evidence.get("verified_sha256", {}).items():
        # Never a declared or submit-time hash: only what this check computed on disk.
        fresh = {o.pointer.path: o.actual_sha256 for o in observations if o.fresh}
        assert fresh[path] == digest
    return verdict


def test_no_pointers_no_patch_runs_with_no_evidence() -> None:
    verdict = decide([], idempotent=False)
    assert (verdict.run, verdict.patch_mode, dict(verdict.evidence)) == (True, "NONE", {})


def test_all_fresh_runs_normally_with_verified_hashes() -> None:
    verdict = decide([observe(A, "A0", "A0"), observe(B, "B0", "B0")], idempotent=False)
    assert verdict.run
    assert verdict.env == {}
    assert verdict.warning is None
    assert verdict.evidence == {
        "patch_mode": PATCH_MODE_NONE,
        "verified_on_disk": True,
        "verified_sha256": {A: HASH["A0"], B: HASH["B0"]},
    }


def test_all_fresh_does_not_need_the_patch_even_a_bad_one() -> None:
    verdict = decide([observe(A, "A0", "A0")], idempotent=True, patch=b"prose, not a patch\n")
    assert verdict.run
    assert verdict.patch_mode == PATCH_MODE_NONE
    assert verdict.env == {}


@pytest.mark.parametrize(
    ("idempotent", "patch", "why"),
    [
        (False, None, "not --idempotent"),
        (False, diff_of(A, B), "not --idempotent"),
        (True, None, "no --patch-file"),
    ],
)
def test_stale_without_a_usable_patch_fails_pointer_stale(
    idempotent: bool, patch: bytes | None, why: str
) -> None:
    verdict = decide(
        [observe(A, "A0", "A1"), observe(B, "B0", "B0")], idempotent=idempotent, patch=patch
    )
    assert not verdict.run
    assert verdict.reason == POINTER_STALE
    assert why in verdict.message
    assert A in verdict.message
    assert verdict.evidence["stale_pointers"] == {A: {"expected": HASH["A0"], "actual": HASH["A1"]}}
    assert verdict.evidence["verified_sha256"] == {B: HASH["B0"]}
    assert verdict.evidence["verified_on_disk"] is False
    error = verdict.error()
    assert error is not None
    assert error.code == "pointer.stale"


def test_missing_file_is_stale_with_actual_none() -> None:
    verdict = decide([observe(A, "A0", None, "missing")], idempotent=False)
    assert verdict.reason == POINTER_STALE
    assert verdict.evidence["stale_pointers"] == {
        A: {"expected": HASH["A0"], "actual": None, "problem": "missing"}
    }
    assert verdict.evidence["verified_sha256"] == {}


def test_stale_idempotent_valid_patch_runs_self_contained() -> None:
    patch = diff_of(A, B)
    verdict = decide([observe(A, "A0", "A1"), observe(B, "B0", "B0")], idempotent=True, patch=patch)
    assert verdict.run
    assert verdict.patch_mode == PATCH_MODE_SELF_CONTAINED
    assert verdict.env == {ENV_PATCH_FILE: PATCH_COPY, ENV_PATCH_MODE: "SELF_CONTAINED"}
    assert verdict.warning is not None
    assert "NOT the reviewed version" in verdict.warning
    assert A in verdict.warning
    assert verdict.evidence == {
        "patch_mode": "SELF_CONTAINED",
        "patch_sha256": sha(patch),
        "verified_on_disk": False,
        "unverified_pointers": [A],
        "verified_sha256": {B: HASH["B0"]},  # only what was checked fresh on disk
        "stale_pointers": {A: {"expected": HASH["A0"], "actual": HASH["A1"]}},
    }


def test_self_contained_never_lists_a_stale_or_declared_hash_as_verified() -> None:
    # Both stale: the declared hashes A0/B0 must appear nowhere in verified_sha256.
    verdict = decide(
        [observe(A, "A0", "A1"), observe(B, "B0", None, "missing")],
        idempotent=True,
        patch=diff_of(A, B),
    )
    assert verdict.patch_mode == PATCH_MODE_SELF_CONTAINED
    assert verdict.evidence["verified_sha256"] == {}
    assert verdict.evidence["unverified_pointers"] == [A, B]


def test_patch_must_cover_every_declared_pointer_not_only_the_stale_ones() -> None:
    verdict = decide(
        [observe(A, "A0", "A1"), observe(B, "B0", "B0")], idempotent=True, patch=diff_of(A)
    )
    assert verdict.reason == "PATCH_DOES_NOT_COVER_POINTERS"
    assert verdict.evidence["patch_gate"]["missing"] == [B]


@pytest.mark.parametrize(
    ("patch", "reason"),
    [
        (b"I reviewed calc.ts and it looks fine to me, ship.", "NOT_A_UNIFIED_DIFF"),
        (diff_of("README.md"), "PATCH_DOES_NOT_COVER_POINTERS"),
        (b"--- a/calc.ts\n+++ b/calc.ts\n", "EMPTY_PATCH_HUNKS"),
    ],
)
def test_patch_failing_a_gate_at_dispatch_fails_with_that_gate(patch: bytes, reason: str) -> None:
    verdict = decide([observe(A, "A0", "A1")], idempotent=True, patch=patch)
    assert not verdict.run
    assert verdict.reason == reason
    assert verdict.evidence["patch_gate"]["reason"] == reason
    assert verdict.evidence["patch_sha256"] == sha(patch)
    error = verdict.error()
    assert isinstance(error, PatchGateError)
    assert error.code == f"patch.{reason}"


@pytest.mark.parametrize(("copy", "found"), [(b"", "changed"), (diff_of(A) + b" ", "changed")])
def test_changed_patch_copy_fails_pointer_stale(copy: bytes, found: str) -> None:
    patch = diff_of(A)
    verdict = decide([observe(A, "A0", "A1")], idempotent=True, patch=patch, copy=copy)
    assert verdict.reason == POINTER_STALE
    assert found in verdict.message
    assert verdict.evidence["patch_copy"] == {"expected": sha(patch), "actual": sha(copy)}


def test_missing_patch_copy_fails_pointer_stale() -> None:
    stored = StoredPatch(path=PATCH_COPY, sha256=sha(diff_of(A)))
    check = PointerCheck((observe(A, "A0", "A1"),))
    verdict = decide_dispatch(check, idempotent=True, patch=stored, patch_bytes=None)
    assert verdict.reason == POINTER_STALE
    assert "missing" in verdict.message
    assert verdict.evidence["patch_copy"] == {"expected": stored.sha256, "actual": None}


# ---- the private patch copy ------------------------------------------------------------


def test_store_patch_is_private_and_named_by_its_hash(tmp_path: Path) -> None:
    src = tmp_path / "review.diff"
    src.write_bytes(diff_of(A))
    patches = tmp_path / "home" / "patches"
    stored = store_patch(src, patches)
    assert stored.sha256 == sha(diff_of(A))
    assert Path(stored.path) == patches / f"{stored.sha256}.patch"
    assert Path(stored.path).read_bytes() == diff_of(A)
    assert stat.S_IMODE(os.stat(stored.path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(patches).st_mode) == 0o700
    assert sorted(p.name for p in patches.iterdir()) == [f"{stored.sha256}.patch"]  # no temp


def test_store_patch_reuses_an_intact_copy_and_repairs_a_damaged_one(tmp_path: Path) -> None:
    first = store_patch_bytes(diff_of(A), tmp_path)
    inode = os.stat(first.path).st_ino
    assert store_patch_bytes(diff_of(A), tmp_path) == first
    assert os.stat(first.path).st_ino == inode
    Path(first.path).write_bytes(b"damaged")
    assert store_patch_bytes(diff_of(A), tmp_path) == first
    assert Path(first.path).read_bytes() == diff_of(A)


def test_store_patch_syncs_the_file_before_the_rename_and_the_dir_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def spy_fsync(fd: int) -> None:
        calls.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def spy_replace(src: Any, dst: Any) -> None:
        calls.append(("replace", str(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", spy_fsync)
    monkeypatch.setattr(os, "replace", spy_replace)
    patches = tmp_path / "patches"
    patches.mkdir()
    stored = store_patch_bytes(diff_of(A), patches)
    assert [kind for kind, _ in calls] == ["fsync", "replace", "fsync"]
    assert calls[0][1].endswith(".tmp")
    assert calls[1][1] == stored.path
    assert calls[2][1] == str(patches)


def test_store_patch_failing_fsync_leaves_no_file_under_the_final_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def failing_fsync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(OSError):
        store_patch_bytes(diff_of(A), tmp_path)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.timeout(60)
def test_concurrent_stores_from_processes_leave_one_whole_copy(tmp_path: Path) -> None:
    data = diff_of(*(f"f{i}.ts" for i in range(2000)))
    (tmp_path / "p.diff").write_bytes(data)
    code = (
        "import sys; from pathlib import Path; from ferry.app.pointers import store_patch; "
        "print(store_patch(Path(sys.argv[1]), Path(sys.argv[2])).path)"
    )
    patches = tmp_path / "patches"
    children = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(tmp_path / "p.diff"), str(patches)],
            stdout=subprocess.PIPE,
        )
        for _ in range(4)
    ]
    outputs = []
    for child in children:
        out, _ = child.communicate(timeout=50)
        assert child.returncode == 0
        outputs.append(out.decode().strip())
    assert set(outputs) == {str(patches / f"{sha(data)}.patch")}
    assert [p.name for p in patches.iterdir()] == [f"{sha(data)}.patch"]
    assert (patches / f"{sha(data)}.patch").read_bytes() == data


# ---- submit, then dispatch, on real files ----------------------------------------------


def test_prepare_patch_refuses_a_failing_patch_and_stores_nothing(
    task_dir: Path, tmp_path: Path
) -> None:
    pointers = resolve_pointers(["calc.ts"], task_dir)
    prose = tmp_path / "prose.txt"
    prose.write_bytes(b"I reviewed calc.ts and it looks fine to me, ship.")
    with pytest.raises(PatchGateError) as caught:
        prepare_patch(prose, pointers, tmp_path / "patches")
    assert caught.value.code == "patch.NOT_A_UNIFIED_DIFF"
    assert not (tmp_path / "patches").exists()
    with pytest.raises(UsageError) as missing:
        prepare_patch(tmp_path / "none.diff", pointers, tmp_path / "patches")
    assert missing.value.code == "usage.patch_missing"


def test_submit_then_dispatch_uses_the_private_copy(task_dir: Path, tmp_path: Path) -> None:
    pointers = resolve_pointers(["calc.ts"], task_dir)
    original = tmp_path / "review.diff"
    patch = b"--- a/calc.ts\n+++ b/calc.ts\n@@ -1 +1 @@\n-export const one = 1;\n+export const one = 2;\n"
    original.write_bytes(patch)
    stored, info = prepare_patch(original, pointers, tmp_path / "patches")
    assert info.sha256 == stored.sha256 == sha(patch)

    fresh = check_before_dispatch(pointers, idempotent=True, patch=stored)
    assert fresh.patch_mode == PATCH_MODE_NONE
    assert fresh.evidence["verified_sha256"] == {"calc.ts": pointers[0].sha256}

    (task_dir / "calc.ts").write_bytes(b"export const one = 3;\n")
    original.write_bytes(b"changed after submit: ferry must not care\n")
    verdict = check_before_dispatch(pointers, idempotent=True, patch=stored)
    assert verdict.patch_mode == PATCH_MODE_SELF_CONTAINED
    assert Path(verdict.env[ENV_PATCH_FILE]).read_bytes() == patch
    assert verdict.evidence["unverified_pointers"] == ["calc.ts"]

    Path(stored.path).write_bytes(patch + b"+tampered\n")
    tampered = check_before_dispatch(pointers, idempotent=True, patch=stored)
    assert tampered.reason == POINTER_STALE
    Path(stored.path).unlink()
    assert check_before_dispatch(pointers, idempotent=True, patch=stored).reason == POINTER_STALE
