"""Unit tests of the OS layer's pure parts and of its fail-closed decisions (the
readers are monkeypatched: we run as root here, so real permission errors are rare)."""

from __future__ import annotations

import errno
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from ferry.core.errors import UsageError
from ferry.failpoints import parse
from ferry.proc import liveness, process
from ferry.proc._outputs import TRAPPED_SIGNALS, SignalTrap, fork_untrapped
from ferry.proc.liveness import Liveness, probe, probe_task
from ferry.proc.process import (
    ProcessIdentity,
    ProcessScan,
    make_marker,
    marker_prefix,
    parse_stat,
    self_identity,
)
from ferry.storage.local.statedir import absolute, filesystem_type, is_network_fs, resolve_home

# --- /proc/<pid>/stat -----------------------------------------------------------------


def stat_line(comm: bytes, state: bytes = b"S", start: int = 12345, flags: int = 4194560) -> bytes:
    rest = [state, b"1", b"42", b"42", b"0", b"-1", str(flags).encode()]
    rest += [b"0"] * 12 + [str(start).encode(), b"0"]
    return b"42 (" + comm + b") " + b" ".join(rest) + b"\n"


@pytest.mark.parametrize("comm", [b"sleep", b"a b", b"x) (y", b"))", b"(", b""])
def test_parse_stat_survives_any_command_name(comm: bytes) -> None:
    st = parse_stat(stat_line(comm))
    assert (st.pid, st.state, st.pgrp, st.session, st.start_time) == (42, "S", 42, 42, 12345)
    assert not st.exited and not st.kernel_thread


def test_parse_stat_flags_zombies_and_kernel_threads() -> None:
    assert parse_stat(stat_line(b"z", state=b"Z")).exited
    assert parse_stat(stat_line(b"k", flags=0x00200040)).kernel_thread


@pytest.mark.parametrize("raw", [b"", b"42 (x)", b"42 (x) S 1 2", b"garbage"])
def test_parse_stat_rejects_garbage(raw: bytes) -> None:
    with pytest.raises(ValueError):
        parse_stat(raw)


# --- identity JSON ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [
        {},
        {"pid": "1", "start_time": 1, "boot_id": "b", "host": "h"},
        {"pid": True, "start_time": 1, "boot_id": "b", "host": "h"},
        {"pid": 1, "start_time": 1.5, "boot_id": "b", "host": "h"},
        {"pid": 0, "start_time": 1, "boot_id": "b", "host": "h"},
        {"pid": 1, "start_time": 1, "boot_id": None, "host": "h"},
        *(
            {"pid": 1, "start_time": 1, "boot_id": "b", "host": "h", kind: ns}
            for ns in (0, -4026531836, "4026531836", True, 1.5)
            for kind in ("pid_ns", "time_ns")
        ),
    ],
)
def test_identity_from_json_is_strict(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        ProcessIdentity.from_json(bad)


def test_an_identity_without_namespaces_is_read_as_before() -> None:
    """Journals and lease files written before ferry recorded the PID and time
    namespaces: the same identity, without them (probed in the reader's namespaces, as
    ever); written without them too, so an older ferry reads exactly what it wrote."""
    old = {"pid": 7, "start_time": 100, "boot_id": "b", "host": "h"}
    for data in (old, {**old, "pid_ns": None, "time_ns": None}):
        ident = ProcessIdentity.from_json(data)
        assert ident == ProcessIdentity(7, 100, "b", "h") and ident.pid_ns is None
        assert ident.time_ns is None and ident.to_json() == old
    spaces = {"pid_ns": 4026531836, "time_ns": 4026531834}
    new = ProcessIdentity.from_json({**old, **spaces})
    assert (new.pid_ns, new.time_ns) == (4026531836, 4026531834)
    assert new.to_json() == {**old, **spaces} and new != ProcessIdentity(7, 100, "b", "h")


def test_markers() -> None:
    assert make_marker("01ABC", 2, "tok") == "01ABC:2:tok"
    assert marker_prefix("01ABC") == "01ABC:"
    assert marker_prefix("01ABC", 2) == "01ABC:2:"
    for bad in ("a:b", "", "x=y"):
        with pytest.raises(ValueError):
            make_marker(bad, 1, "tok")


# --- probes fail closed ----------------------------------------------------------------


def raising(exc: BaseException) -> object:
    def reader(*_args: object, **_kwargs: object) -> object:
        raise exc

    return reader


@pytest.mark.parametrize(
    "exc",
    [
        PermissionError(errno.EACCES, "denied"),
        OSError(errno.EIO, "io"),
        ValueError("unparseable"),
    ],
)
def test_an_unreadable_process_is_unknown_never_dead(
    monkeypatch: pytest.MonkeyPatch, exc: BaseException
) -> None:
    monkeypatch.setattr(liveness, "read_stat", raising(exc))
    assert probe(self_identity()) is Liveness.UNKNOWN


def test_absent_from_proc_but_present_to_kill_is_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    # /proc mounted with hidepid hides other users' processes; kill(pid, 0) still sees them.
    monkeypatch.setattr(liveness, "read_stat", lambda _pid: None)
    monkeypatch.setattr(liveness, "pid_absent", lambda _pid: False)
    assert probe(self_identity()) is Liveness.UNKNOWN
    monkeypatch.setattr(liveness, "pid_absent", lambda _pid: True)
    assert probe(self_identity()) is Liveness.DEAD


def test_unreadable_boot_id_is_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(liveness, "boot_id", raising(PermissionError(errno.EACCES, "denied")))
    assert probe(self_identity()) is Liveness.UNKNOWN


def gone_identity() -> ProcessIdentity:
    me = self_identity()
    return ProcessIdentity(me.pid, me.start_time + 1, me.boot_id, me.host)  # "pid reused"


def test_an_incomplete_marker_scan_makes_a_task_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        liveness, "scan_processes", lambda *_a, **_k: ProcessScan((), (), unreadable=(4242,))
    )
    assert probe_task("T:1:x", gone_identity()) is Liveness.UNKNOWN
    assert probe_task("T:1:x", None) is Liveness.UNKNOWN


def test_a_task_with_only_zombies_left_is_dead(monkeypatch: pytest.MonkeyPatch) -> None:
    zombie = gone_identity()
    monkeypatch.setattr(
        liveness, "scan_processes", lambda *_a, **_k: ProcessScan((), (zombie,), ())
    )
    assert probe_task("T:1:x", gone_identity()) is Liveness.DEAD


def test_an_unknown_leader_with_nothing_found_is_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(liveness, "probe", lambda _ident: Liveness.UNKNOWN)
    monkeypatch.setattr(liveness, "scan_processes", lambda *_a, **_k: ProcessScan((), (), ()))
    assert probe_task("T:1:x", self_identity()) is Liveness.UNKNOWN


def test_a_scan_counts_unreadable_environments_of_our_own_user(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    child_pid = os.getpid()
    monkeypatch.setattr(process, "_environ_has", raising(PermissionError(errno.EACCES, "no")))
    scan = process.scan_processes("T:1:")
    assert not scan.complete and child_pid in scan.unreadable
    assert probe_task("T:1:x", None) is Liveness.UNKNOWN


# --- state directory paths and filesystems ----------------------------------------------


def test_resolve_home_precedence() -> None:
    env = {"FERRY_HOME": "/f", "XDG_STATE_HOME": "/x", "HOME": "/h"}
    assert resolve_home("/cli", env) == "/cli"
    assert resolve_home(None, env) == "/f"
    assert resolve_home(None, {**env, "FERRY_HOME": ""}) == "/x/ferry"
    assert resolve_home(None, {"XDG_STATE_HOME": "relative", "HOME": "/h"}) == (
        "/h/.local/state/ferry"
    )
    assert resolve_home(None, {"HOME": "/h"}) == "/h/.local/state/ferry"
    assert os.path.isabs(resolve_home("rel", {}))


@pytest.mark.parametrize(
    "given",
    [".", "./", "rel", "rel/", "rel//x/./y/", "../up", "/", "//", "///", "//two", "///three",
     "/a/b/", "/a//b/./c/.", "/a/../b", "~", "~/", "~//x/./", "~root", "~root/x/",
     "~no-such-user-here", "~no-such-user-here/x", "a/~", "./~", " ", "/~x"],
)  # fmt: skip
def test_resolve_home_spells_the_path_as_pathlib_did(
    given: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The home is a str now (no pathlib on the start-up path), spelled exactly as
    ``str(Path(x).expanduser().absolute())`` spelled it: no ``.`` part, no repeated or
    trailing slash, ``..`` kept, ``~`` and ``~user`` expanded (one that cannot be, for
    which pathlib raises RuntimeError, is ``usage.bad_home``), relative to the working
    directory."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home") + "//")
    for environ, cli in (({}, given), ({"FERRY_HOME": given}, None)):
        try:
            want = str(Path(given).expanduser().absolute())
        except RuntimeError:
            with pytest.raises(UsageError) as refused:
                resolve_home(cli, environ)
            assert refused.value.code == "usage.bad_home"
            continue
        assert resolve_home(cli, environ) == want
    # (ensure_home and open_home_for_reading: Path(x).absolute(), no ~ expanded)
    assert absolute(given) == str(Path(given).absolute())


MOUNTINFO = """\
22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw
40 27 0:40 / /srv/nfs rw,relatime shared:5 - nfs4 fs:/export rw,vers=4.2
41 40 0:41 / /srv/nfs/local rw,relatime - ext4 /dev/vdb rw
42 27 0:42 / /mnt/with\\040space rw - cifs //srv/share rw
43 27 0:43 / /home/u/remote rw,nosuid - fuse.sshfs u@host:/ rw
44 27 0:44 / /home/u/overlay rw - fuse.fuse-overlayfs fuse-overlayfs rw
45 27 0:45 / /srv/nfsish rw - ext4 /dev/vdc rw
"""


@pytest.mark.parametrize(
    ("path", "fstype"),
    [
        ("/var/lib/ferry", "ext4"),
        ("/srv/nfs/ferry", "nfs4"),
        ("/srv/nfs", "nfs4"),
        ("/srv/nfs/local/ferry", "ext4"),
        ("/srv/nfsish/ferry", "ext4"),
        ("/mnt/with space/ferry", "cifs"),
        ("/home/u/remote/.local/state/ferry", "fuse.sshfs"),
        ("/home/u/overlay/ferry", "fuse.fuse-overlayfs"),
    ],
)
def test_filesystem_type_is_the_longest_mount_prefix(path: str, fstype: str) -> None:
    assert filesystem_type(Path(path), MOUNTINFO) == fstype


@pytest.mark.parametrize(
    ("fstype", "network"),
    [
        ("nfs", True),
        ("nfs4", True),
        ("cifs", True),
        ("smb3", True),
        ("fuse.sshfs", True),
        ("9p", True),
        ("ceph", True),
        ("ext4", False),
        ("xfs", False),
        ("btrfs", False),
        ("tmpfs", False),
        ("overlay", False),
        ("fuse.fuse-overlayfs", False),
        ("fuse", False),
    ],
)
def test_network_filesystems(fstype: str, network: bool) -> None:
    assert is_network_fs(fstype) is network


def test_filesystem_type_of_garbage_is_none() -> None:
    assert filesystem_type(Path("/x"), "not a mountinfo line\n\n") is None


# --- failpoint spec ------------------------------------------------------------------


def _parsed(text: str | None) -> dict[str, tuple[int, str, str | None]]:
    return {name: (p.nth, p.action, p.scope) for name, p in parse(text).items()}


def test_failpoint_spec_parsing() -> None:
    assert parse(None) == {}
    assert parse("") == {}
    assert _parsed("a, before:SPAWNED=3 ,,") == {
        "a": (1, "kill", None), "before:SPAWNED": (3, "kill", None),
    }  # fmt: skip
    assert _parsed("a=stop,b=2=stop,c=self,supervisor:after:spawn=self,launcher:d") == {
        "a": (1, "stop", None), "b": (2, "stop", None), "c": (1, "self", None),
        "after:spawn": (1, "self", "supervisor"), "d": (1, "kill", "launcher"),
    }  # fmt: skip
    for bad in ("a=0", "a=x", "a=-1", "a=2=later"):
        with pytest.raises(ValueError):
            parse(bad)


# --- the signal trap ------------------------------------------------------------------


@pytest.fixture
def trappable() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP at their defaults, as the trap finds them in a command
    run from a shell (an xdist worker inherits SIGINT ignored: the trap leaves it so)."""
    old = {sig: signal.signal(sig, signal.SIG_DFL) for sig in TRAPPED_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


@pytest.mark.usefixtures("trappable")
def test_a_signal_counts_from_its_byte_before_its_python_handler_runs() -> None:
    # The C handler writes the byte at once; the Python handler runs at the next check.
    # Between the two, a drain must not swallow the signal (a second Ctrl-C was lost so).
    with SignalTrap() as trap:
        assert trap.wakeup_fd is not None and trap._write_fd is not None
        os.write(trap._write_fd, bytes([signal.SIGINT, signal.SIGUSR1, signal.SIGTERM]))
        trap.drain()
        assert trap.received == [signal.SIGINT, signal.SIGTERM]  # (SIGUSR1: not trapped)
        os.kill(os.getpid(), signal.SIGHUP)  # a real one, through both handlers
        trap.drain()
        trap.drain()
        assert trap.received == [signal.SIGINT, signal.SIGTERM, signal.SIGHUP]  # (once)


@pytest.mark.usefixtures("trappable")
def test_a_child_forked_under_a_trap_writes_nothing_into_its_pipe() -> None:
    # A forked supervisor inherits the launcher's wakeup fd: a signal it got before its
    # own trap would count as the launcher's (a worker stopping its tasks at one Ctrl-C),
    # or, once it closed its inherited descriptors, land as a byte in a file it opened.
    with SignalTrap() as trap:
        pid = fork_untrapped()
        if pid == 0:
            os.kill(os.getpid(), signal.SIGINT)  # (the launcher's handler: ignored)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        trap.drain()
        assert trap.received == []
