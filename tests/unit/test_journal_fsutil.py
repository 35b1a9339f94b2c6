"""journal/_fsutil.py is the only door to the disk, and it uses only the os functions its
docstring lists (a simulated disk relies on both)."""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path
from typing import Any

import pytest

import journal._fsutil as fsutil
from journal import Journal, read_records, repair, verify

JOURNAL_DIR = Path(fsutil.__file__).parent
# Path methods and builtins that would touch the disk behind _fsutil's back.
DISK_METHODS = {
    "exists", "is_file", "is_dir", "open", "read_bytes", "read_text", "write_bytes",
    "write_text", "stat", "lstat", "iterdir", "glob", "rglob", "unlink", "mkdir", "rmdir",
    "rename", "touch", "chmod", "resolve", "samefile", "readlink", "symlink_to",
}  # fmt: skip
IO_MODULES = {"os", "fcntl", "shutil", "io", "tempfile", "mmap", "posix"}


def documented_os_names() -> set[str]:
    doc = fsutil.__doc__ or ""
    return set(re.findall(r"^\s+os\.(\w+)\(", doc, re.M))


@pytest.mark.parametrize(
    "path",
    sorted(p for p in JOURNAL_DIR.glob("*.py") if p.name != "_fsutil.py"),
    ids=lambda p: p.name,
)
def test_no_other_module_touches_the_disk(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            assert not {a.name.split(".")[0] for a in node.names} & IO_MODULES, path.name
        elif isinstance(node, ast.ImportFrom) and node.module:
            assert node.module.split(".")[0] not in IO_MODULES, path.name
        elif isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name):
                assert func.id != "open", f"{path.name}:{node.lineno} calls open()"
            elif isinstance(func, ast.Attribute) and not (
                isinstance(func.value, ast.Name) and func.value.id == "_fsutil"
            ):
                assert func.attr not in DISK_METHODS, (
                    f"{path.name}:{node.lineno} calls .{func.attr}()"
                )


def test_fsutil_calls_only_the_documented_os_functions() -> None:
    tree = ast.parse(Path(fsutil.__file__).read_text(encoding="utf-8"))
    called = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "os"
            and not node.attr.startswith(("O_", "SEEK_"))
        ):
            called.add(node.attr)
    # getattr(os, "fdatasync") is the optional one; O_* and SEEK_* constants are read
    # at import.
    assert called <= documented_os_names()
    assert "fdatasync" in documented_os_names()


class RecordingOS:
    def __init__(self) -> None:
        self.names: set[str] = set()

    def __getattr__(self, name: str) -> Any:
        self.names.add(name)
        return getattr(os, name)


def test_a_full_workload_uses_only_the_documented_surface(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recording = RecordingOS()
    monkeypatch.setattr(fsutil, "os", recording)
    directory = tmp_path / "a" / "b"
    with Journal.open(directory, segment_bytes_max=200) as j:
        for i in range(10):
            j.append("T", {"i": i})
        j.write_snapshot(8, b"s")
        j.compact()
        j.refresh()
    segment = sorted(directory.glob("*.jsonl"))[-1]
    with segment.open("ab") as f:
        f.write(b"torn")
    assert verify(directory).status == "torn_tail"
    assert repair(directory).repaired
    first_seq = verify(directory).first_seq
    assert [r.seq for r in read_records(directory, first_seq)][-1] == 10
    assert recording.names <= documented_os_names(), recording.names - documented_os_names()


def test_write_all_loops_on_short_writes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    chunks: list[bytes] = []

    class Short:
        def write(self, fd: int, data: Any) -> int:
            chunks.append(bytes(data[:3]))
            return min(3, len(data))

    monkeypatch.setattr(fsutil, "os", Short())
    fsutil.write_all(5, b"0123456789")
    assert b"".join(chunks) == b"0123456789" and len(chunks) == 4


def test_write_all_refuses_a_zero_write(monkeypatch: pytest.MonkeyPatch) -> None:
    class Stuck:
        calls = 0

        def write(self, fd: int, data: Any) -> int:
            Stuck.calls += 1
            return 2 if Stuck.calls == 1 else 0

    monkeypatch.setattr(fsutil, "os", Stuck())
    with pytest.raises(OSError):
        fsutil.write_all(5, b"0123456789")


def test_sync_data_falls_back_to_fsync(monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[str] = []

    class NoFdatasync:
        def fsync(self, fd: int) -> None:
            synced.append("fsync")

    monkeypatch.setattr(fsutil, "os", NoFdatasync())
    fsutil.sync_data(3)
    assert synced == ["fsync"]


def test_atomic_replace_leaves_the_new_content_and_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "file"
    target.write_bytes(b"old")
    (tmp_path / ".file.tmp").write_bytes(b"leftover of a crash")
    fsutil.atomic_replace(str(target), b"new")
    assert target.read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]
    assert (target.stat().st_mode & 0o777) == 0o600


def test_makedirs_creates_private_dirs_and_fsyncs_each_parent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[Path] = []
    real = fsutil.fsync_dir

    def fsync_dir(path: Path | str) -> None:
        synced.append(Path(path))
        real(path)

    monkeypatch.setattr(fsutil, "fsync_dir", fsync_dir)
    fsutil.makedirs(str(tmp_path / "x" / "y"))
    assert synced == [tmp_path, tmp_path / "x"]
    assert ((tmp_path / "x" / "y").stat().st_mode & 0o777) == 0o700
    synced.clear()
    fsutil.makedirs(str(tmp_path / "x" / "y"))  # already there: nothing to make durable
    assert synced == []
