"""The state directory: created private, unsafe ones refused with a coded error."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from ferry.core.errors import StateDirError
from ferry.storage.local.statedir import SUBDIRS, ensure_home, private_open

NOBODY = 65534


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


@pytest.fixture
def wide_umask() -> Iterator[None]:
    old = os.umask(0)  # the most permissive umask: modes must still come out private
    try:
        yield
    finally:
        os.umask(old)


def refused(path: Path) -> str:
    with pytest.raises(StateDirError) as caught:
        ensure_home(path)
    assert caught.value.exit_code == 125
    assert caught.value.details["path"]
    return caught.value.code


def test_created_private_with_its_subdirectories(tmp_path: Path, wide_umask: None) -> None:
    home = Path(ensure_home(tmp_path / "a" / "b" / "ferry"))
    assert home.is_absolute() and mode(home) == 0o700
    for name in SUBDIRS:
        assert mode(home / name) == 0o700
    assert ensure_home(home) == str(home), "idempotent"


def test_private_open_creates_0600_files(tmp_path: Path, wide_umask: None) -> None:
    home = Path(ensure_home(tmp_path / "home"))
    fd = private_open(home / "logs" / "x.log", os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        assert stat.S_IMODE(os.fstat(fd).st_mode) == 0o600
        assert os.get_inheritable(fd) is False
    finally:
        os.close(fd)


def test_private_open_never_follows_a_planted_symlink(tmp_path: Path) -> None:
    home = Path(ensure_home(tmp_path / "home"))
    target = tmp_path / "target"
    target.write_text("keep")
    (home / "logs" / "x.log").symlink_to(target)
    with pytest.raises(StateDirError) as caught:
        private_open(home / "logs" / "x.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    assert caught.value.code == "state_dir.symlink"
    assert target.read_text() == "keep"


def test_a_symlinked_home_is_refused(tmp_path: Path) -> None:
    real = Path(ensure_home(tmp_path / "real"))
    link = tmp_path / "link"
    link.symlink_to(real)
    assert refused(link) == "state_dir.symlink"


def test_a_dangling_symlinked_home_is_refused_and_not_created(tmp_path: Path) -> None:
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "nowhere")
    assert refused(link) == "state_dir.symlink"
    assert not (tmp_path / "nowhere").exists()


@pytest.mark.parametrize("name", SUBDIRS)
def test_a_symlinked_subdirectory_is_refused(tmp_path: Path, name: str) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (home / name).symlink_to(elsewhere)
    assert refused(home) == "state_dir.symlink"


@pytest.mark.parametrize("bits", [0o777, 0o770, 0o720, 0o702, 0o1777])
def test_a_group_or_world_writable_home_is_refused(tmp_path: Path, bits: int) -> None:
    home = tmp_path / "home"
    home.mkdir()
    home.chmod(bits)
    assert refused(home) == "state_dir.permissions"


def test_a_writable_subdirectory_is_refused(tmp_path: Path) -> None:
    home = Path(ensure_home(tmp_path / "home"))
    (home / "logs").chmod(0o777)
    assert refused(home) == "state_dir.permissions"


def test_a_home_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to chown")
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    os.chown(home, NOBODY, NOBODY)
    assert refused(home) == "state_dir.not_owned"


def test_a_subdirectory_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to chown")
    home = Path(ensure_home(tmp_path / "home"))
    os.chown(home / "journal", NOBODY, NOBODY)
    assert refused(home) == "state_dir.not_owned"


def test_a_file_where_the_home_should_be_is_refused(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.write_text("")
    assert refused(home) == "state_dir.not_a_directory"


def test_a_file_in_the_way_of_a_parent_is_refused(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    assert refused(tmp_path / "file" / "sub" / "ferry") == "state_dir.not_a_directory"


def test_a_network_filesystem_is_refused(tmp_path: Path) -> None:
    home = tmp_path / "home"
    real = os.path.realpath(tmp_path)
    mountinfo = (
        "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n"
        f"99 27 0:50 / {real} rw,relatime - nfs4 server:/export rw,vers=4.2\n"
    )
    with pytest.raises(StateDirError) as caught:
        ensure_home(home, mountinfo=mountinfo)
    assert caught.value.code == "state_dir.network_fs"
    assert caught.value.details["fstype"] == "nfs4"


def test_not_writable_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Root may write anywhere, so a read-only mount is simulated at os.access (which
    # is what reports EROFS as "not writable").
    home = Path(ensure_home(tmp_path / "home"))
    monkeypatch.setattr(os, "access", lambda *_a, **_k: False)
    assert refused(home) == "state_dir.not_writable"


class FsyncSpy:
    """Stands in for ``os`` in ferry.storage.local.statedir: real calls, noting which directories
    were fsynced (by path)."""

    def __init__(self) -> None:
        self.paths: dict[int, str] = {}
        self.fsynced: list[str] = []

    def __getattr__(self, name: str) -> object:
        return getattr(os, name)

    def open(self, path: object, flags: int, *args: object, **kwargs: object) -> int:
        fd = os.open(path, flags, *args, **kwargs)  # type: ignore[arg-type]
        self.paths[fd] = os.path.realpath(os.fspath(path))  # type: ignore[arg-type]
        return fd

    def fsync(self, fd: int) -> None:
        os.fsync(fd)
        self.fsynced.append(self.paths[fd])


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> FsyncSpy:
    from ferry.storage.local import statedir

    watching = FsyncSpy()
    monkeypatch.setattr(statedir, "os", watching)
    return watching


def test_each_directory_a_fresh_home_makes_is_fsynced_in_its_parent(
    tmp_path: Path, spy: FsyncSpy
) -> None:
    """A directory survives a power cut only once its parent was fsynced after it was
    made: the parents made on the way, the home (in its parent), its subdirectories
    (in the home, once for all)."""
    home = tmp_path / "a" / "b" / "ferry"
    ensure_home(home)
    real = os.path.realpath
    assert sorted(spy.fsynced) == sorted(
        real(p) for p in (tmp_path, tmp_path / "a", tmp_path / "a" / "b", home)
    )


def test_an_existing_home_pays_no_fsync(tmp_path: Path, spy: FsyncSpy) -> None:
    """ensure_home runs at every command's start (ferry run's start-up cost)."""
    home = Path(ensure_home(tmp_path / "home"))
    spy.fsynced.clear()
    ensure_home(home)
    assert spy.fsynced == []
    (home / "logs").rmdir()  # a subdirectory gone: made again, and made durable
    ensure_home(home)
    assert spy.fsynced == [os.path.realpath(home)]


def test_a_subdirectory_made_after_ensure_home_is_made_durable(
    tmp_path: Path, spy: FsyncSpy
) -> None:
    """archive/ made again by compaction, if it went missing after ensure_home."""
    from ferry.storage.local.statedir import make_dir_durable

    home = Path(ensure_home(tmp_path / "home"))
    (home / "archive").rmdir()
    spy.fsynced.clear()
    make_dir_durable(home / "archive")
    make_dir_durable(home / "archive")  # there: nothing to make durable
    assert (home / "archive").is_dir() and mode(home / "archive") == 0o700
    assert spy.fsynced == [os.path.realpath(home)]


def test_a_kept_end_survives_a_power_cut_with_its_outbox(tmp_path: Path, spy: FsyncSpy) -> None:
    """The outbox (a supervisor's end the database could not take) is made at its first
    use: its entry in the home is fsynced then, as every directory ferry makes after
    ensure_home is (make_dir_durable). Before, only the outbox itself was: a power cut
    could take the directory, and the kept end with it."""
    from ferry.app import outbox
    from ferry.core import events as ev
    from ferry.core.model import State

    home = ensure_home(tmp_path / "home")
    spy.fsynced.clear()
    end = ev.Settled("t1", 1, "tok", State.SUCCEEDED, None, 0)
    kept = outbox.keep(home, [end])
    real = os.path.realpath
    directories = [path for path in spy.fsynced if os.path.isdir(path)]  # (not the file)
    assert sorted(directories) == sorted([real(home), real(os.path.dirname(kept))])
    spy.fsynced.clear()
    outbox.keep(home, [ev.Settled("t2", 1, "tok", State.SUCCEEDED, None, 0)])
    directories = [path for path in spy.fsynced if os.path.isdir(path)]
    assert directories == [real(os.path.dirname(kept))]  # (there now: nothing more)
