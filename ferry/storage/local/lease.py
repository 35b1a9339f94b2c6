"""The leader lease: ``lease.json``, taken and renewed by compare-and-swap, with epochs.

``lease.json`` (one JSON object, version ``v`` = 1)::

    {"v": 1, "epoch": 7, "holder": {"pid":..,"start_time":..,"boot_id":..,"host":..} | null,
     "acquired_at": 1715000000.1, "renewed_at": ..., "expires_at": ...,   # wall clock, for humans
     "expires_boot_s": 5123.4}        # CLOCK_BOOTTIME of the holder's boot: decides expiry

Every change happens under a short exclusive ``flock`` on ``lease.json.lock`` (no soft
fallback: on a filesystem without flock ferry refuses to run rather than pretend), and
is: read, decide, write the new content by atomic replace. Nothing else happens under
the lock.

* ``acquire``: allowed when there is no lease, it was released, its holder is proven
  DEAD (replaced at once), it has expired (a hung holder: only after expiry), or the
  holder is the caller. The new epoch is ``max(file epoch, min_epoch) + 1``: epochs
  never go backwards, even if ``lease.json`` was deleted (the service passes the highest
  epoch the journal has seen as ``min_epoch``).
* ``renew`` / ``release``: only if the file still shows the same epoch and holder;
  ``release`` keeps the epoch (holder null) so the next leader counts on from it.

Expiry is measured on CLOCK_BOOTTIME, not the wall clock: a wall-clock step (NTP, a
manual ``date``) must neither expire a live leader early nor keep a dead one late.
BOOTTIME is shared by every process of one boot and keeps counting during suspend; a
holder from another boot is dead anyway. What the lease does *not* guarantee is in
docs/leases.md (fencing is the journal's job).

A lease file that cannot be read is never overwritten by ``acquire``: it raises
``lease.unreadable`` (or ``lease.version`` for a newer format). Only the explicit
operator action :meth:`LeaseStore.reset` moves it aside.
"""

from __future__ import annotations

import errno
import fcntl
import math
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from ferry.core.errors import LeaseHeldError, StateDirError
from ferry.failpoints import failpoint
from ferry.proc.liveness import Liveness, probe
from ferry.proc.process import ProcessIdentity, boot_clock
from ferry.storage.local.statedir import private_open, write_atomic
from journal import _json

TYPE_CHECKING = False  # (typing is not imported at run time: start-up)
if TYPE_CHECKING:
    from typing import Any, TypeGuard

__all__ = [
    "LEASE_VERSION",
    "Lease",
    "LeaseLostError",
    "LeaseStore",
    "LeaseUnreadableError",
    "boot_clock",
    "parse_lease",
    "read_lease_fd",
]

LEASE_VERSION = 1
_LEASE_BYTES_MAX = 64 * 1024
# A busy short lock is tried again this often (its holders keep it for a read, a
# decision and an atomic write: a few milliseconds).
LOCK_POLL_S = 0.005


class LeaseLostError(LeaseHeldError):
    """The lease is no longer ours (another leader took it, or it was released)."""

    code = "lease.lost"


class LeaseUnreadableError(StateDirError):
    """``lease.json`` is truncated, empty, not JSON, of the wrong shape (``lease.unreadable``)
    or from a newer ferry (``lease.version``). Never overwritten except by ``reset``."""

    code = "lease.unreadable"


@dataclass(frozen=True, slots=True)
class Lease:
    """The lease file's content: who leads (``holder``), under which fencing
    ``epoch``, and until when."""

    epoch: int
    holder: ProcessIdentity | None  # None: released
    acquired_at: float  # wall clock (seconds since 1970), for humans
    renewed_at: float
    expires_at: float
    expires_boot_s: float  # boot_clock() deadline in the holder's boot

    def to_json(self) -> dict[str, Any]:
        return {
            "v": LEASE_VERSION,
            "epoch": self.epoch,
            "holder": None if self.holder is None else self.holder.to_json(),
            "acquired_at": self.acquired_at,
            "renewed_at": self.renewed_at,
            "expires_at": self.expires_at,
            "expires_boot_s": self.expires_boot_s,
        }

    @classmethod
    def from_json(cls, data: object) -> Lease:
        """Strict parse; raises :class:`LeaseUnreadableError` (``lease.unreadable`` /
        ``lease.version``)."""
        if not isinstance(data, dict):
            raise _unreadable("not a JSON object")
        version = data.get("v")
        if not _is_int(version) or version < 1:
            raise _unreadable(f"bad version field {version!r}")
        if version > LEASE_VERSION:
            raise LeaseUnreadableError(
                f"lease.json has version {version}; this ferry reads up to {LEASE_VERSION}",
                code="lease.version",
                details={"version": version, "supported": LEASE_VERSION},
            )
        epoch = data.get("epoch")
        if not _is_int(epoch) or epoch < 0:
            raise _unreadable(f"bad epoch {epoch!r}")
        holder_json = data.get("holder")
        try:
            holder = None if holder_json is None else ProcessIdentity.from_json(holder_json)
        except (ValueError, AttributeError) as e:
            raise _unreadable(f"bad holder: {e}") from e
        times = [data.get(k) for k in ("acquired_at", "renewed_at", "expires_at", "expires_boot_s")]
        if not all(_is_finite_number(t) for t in times):
            raise _unreadable(f"bad times {times!r}")
        acquired, renewed, expires, expires_boot = (float(t) for t in times)  # type: ignore[arg-type]
        return cls(epoch, holder, acquired, renewed, expires, expires_boot)


def parse_lease(raw: bytes) -> Lease:
    """The bytes of a lease file -> Lease, or :class:`LeaseUnreadableError`; never
    anything else, whatever the bytes."""
    if len(raw) > _LEASE_BYTES_MAX:
        raise _unreadable(f"larger than {_LEASE_BYTES_MAX} bytes")
    if not raw.strip():
        raise _unreadable("empty file")
    try:
        data = _json.loads(raw)
    except ValueError as e:
        raise _unreadable(f"not JSON ({e})") from e
    return Lease.from_json(data)


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_finite_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


# What the operator can do: ferry never overwrites the file itself (see the docstring).
_UNREADABLE_HINT = (
    "; ferry will not overwrite it: once no ferry leader runs, run 'ferry lease --reset' "
    "(epochs continue from the journal)"
)


def _unreadable(why: str) -> LeaseUnreadableError:
    return LeaseUnreadableError(
        f"lease.json is unreadable: {why}{_UNREADABLE_HINT}", details={"why": why}
    )


class LeaseStore:
    """``lease.json`` at ``path`` (inside a state directory checked by ``ensure_home``)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        ttl_s: float,
        *,
        lock_timeout_s: float = 10.0,
        probe_holder: Callable[[ProcessIdentity], Liveness] = probe,
        clock: Callable[[], float] = boot_clock,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        if not (ttl_s > 0 and math.isfinite(ttl_s)):
            raise ValueError(f"lease ttl must be a positive number of seconds, not {ttl_s!r}")
        self.path = Path(path)
        self.lock_path = self.path.with_name(self.path.name + ".lock")
        self.ttl_s = ttl_s
        self._lock_timeout_s = lock_timeout_s
        self._probe = probe_holder
        self._clock = clock
        self._wall = wall_clock

    # --- public ----------------------------------------------------------------------

    def read(self) -> Lease | None:
        """The lease as written (None when there is no lease file). Takes no lock: the
        file is only ever replaced atomically, so a reader sees one whole version."""
        raw = self._read_bytes()
        return None if raw is None else parse_lease(raw)

    def led(self) -> bool:
        lease = self.read()
        return (
            lease is not None
            and lease.holder is not None
            and (self._probe(lease.holder) is not Liveness.DEAD)
        )

    def expired(self, lease: Lease) -> bool:
        return self._clock() >= lease.expires_boot_s

    def acquire(self, me: ProcessIdentity, *, min_epoch: int = 0) -> Lease:
        """Take the lease with a new epoch, or raise ``lease.held`` (exit 75)."""
        with self._locked():
            current = self.read()
            if current is not None and current.holder is not None and current.holder != me:
                liveness = self._probe(current.holder)
                if liveness is not Liveness.DEAD and not self.expired(current):
                    raise LeaseHeldError(
                        f"the lease is held by pid {current.holder.pid} "
                        f"on {current.holder.host} (epoch {current.epoch})",
                        details={
                            "holder": current.holder.to_json(),
                            "epoch": current.epoch,
                            "expires_at": current.expires_at,
                            "holder_liveness": str(liveness),
                        },
                    )
            epoch = max(0 if current is None else current.epoch, min_epoch) + 1
            wall, boot = self._wall(), self._clock()
            lease = Lease(epoch, me, wall, wall, wall + self.ttl_s, boot + self.ttl_s)
            self._write(lease)
            return lease

    def renew(self, lease: Lease) -> Lease:
        """Push the expiry out by ``ttl_s``. Raises ``lease.lost`` if it is no longer ours;
        on any error the caller must stop acting as leader."""
        with self._locked():
            self._check_ours(lease)
            wall, boot = self._wall(), self._clock()
            renewed = replace(
                lease,
                renewed_at=wall,
                expires_at=wall + self.ttl_s,
                expires_boot_s=boot + self.ttl_s,
            )
            self._write(renewed)
            return renewed

    def release(self, lease: Lease) -> bool:
        """Give the lease up, keeping its epoch. False if it was no longer ours (nothing
        written)."""
        with self._locked():
            try:
                self._check_ours(lease)
            except LeaseLostError:
                return False
            wall, boot = self._wall(), self._clock()
            self._write(
                Lease(lease.epoch, None, lease.acquired_at, wall, wall, boot),
            )
            return True

    def reset(self, *, min_epoch: int) -> Path | None:
        """Operator action for an unreadable ``lease.json``: move it aside (returned path)
        and write a released lease at ``min_epoch`` (pass the journal's highest epoch).
        Does nothing (None) when the lease file reads fine."""
        with self._locked():
            try:
                self.read()
                return None
            except LeaseUnreadableError:
                pass
            aside = self.path.with_name(f"{self.path.name}.bad.{time.time_ns()}")
            os.rename(self.path, aside)
            wall, boot = self._wall(), self._clock()
            self._write(Lease(min_epoch, None, wall, wall, wall, boot))
            return aside

    # --- internals -------------------------------------------------------------------

    def _check_ours(self, lease: Lease) -> None:
        current = self.read()
        if current is None or current.epoch != lease.epoch or current.holder != lease.holder:
            raise LeaseLostError(
                f"lease epoch {lease.epoch} is no longer ours"
                + ("" if current is None else f" (the lease is at epoch {current.epoch})"),
                details={
                    "epoch": lease.epoch,
                    "current": None if current is None else current.to_json(),
                },
            )

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """The short exclusive lock, waited for up to ``lock_timeout_s`` (then
        ``lease.busy``, exit 75). An flock: it goes when its holder dies, too."""
        try:  # (0600, no symlink followed: _lock_refusal names both refusals)
            flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(self.lock_path, flags, 0o600)
        except OSError as e:
            raise _lock_refusal(self.lock_path, e) from e
        try:
            _flock_within(fd, self._lock_timeout_s, self.lock_path)
            try:
                yield
            finally:
                # Unlocked, not only closed: a process forked meanwhile would share the
                # open file description, and with it the lock, for its whole life.
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def _read_bytes(self) -> bytes | None:
        return _read_lease_bytes(self.path)

    def _write(self, lease: Lease) -> None:
        failpoint("before:lease_write")
        # Atomic and durable (fsync, rename, directory fsync): a power loss must never
        # bring back an older lease.json, whose epoch the next acquire would hand out
        # again. The lease lock is held: a fixed temp name (a crash's stale one is reused).
        data = _json.dumps(lease.to_json()) + b"\n"
        write_atomic(self.path.parent, self.path.name, data, temp_name=self.path.name + ".tmp")
        failpoint("after:lease_write")


def epoch_at(path: str | os.PathLike[str]) -> int:
    """The epoch the lease file holds now (0: none, or unreadable)."""
    try:
        raw = _read_lease_bytes(Path(path))
        return 0 if raw is None else parse_lease(raw).epoch
    except (OSError, LeaseUnreadableError):
        return 0


def _read_lease_bytes(path: Path) -> bytes | None:
    try:
        fd = private_open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        return read_lease_fd(fd)
    except IsADirectoryError:
        raise _unreadable(f"{path} is a directory") from None
    finally:
        os.close(fd)


def read_lease_fd(fd: int) -> bytes:
    """Every byte of the lease file open on ``fd`` (``lease.unreadable`` past 64 KiB)."""
    chunks: list[bytes] = []
    size = 0
    while chunk := os.pread(fd, 65536, size):
        chunks.append(chunk)
        size += len(chunk)
        if size > _LEASE_BYTES_MAX:
            raise _unreadable(f"larger than {_LEASE_BYTES_MAX} bytes")
    return b"".join(chunks)


def _flock_within(fd: int, timeout_s: float, lock_path: Path) -> None:
    """Take an exclusive flock on ``fd``, trying again every LOCK_POLL_S until
    ``timeout_s`` has passed. (filelock's UnixFileLock did this before; filelock 4
    imports logging, secrets and decimal: 13 ms of every ``work``, ``claim`` and
    ``recover``.) No soft fallback: a file system without flock is refused."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise LeaseHeldError(
                    f"timed out after {timeout_s}s waiting for {lock_path}",
                    code="lease.busy",
                    details={"lock": str(lock_path)},
                ) from None
            time.sleep(LOCK_POLL_S)
        except OSError as e:
            raise _lock_refusal(lock_path, e) from e


def _lock_refusal(lock_path: Path, e: OSError) -> StateDirError:
    details = {"lock": str(lock_path), "errno": e.errno}
    if e.errno == errno.ELOOP:
        return StateDirError(
            f"refusing to follow a symlink at {lock_path}",
            code="state_dir.symlink",
            details=details,
        )
    if e.errno in (errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP):
        return StateDirError(
            f"file locks do not work on the filesystem of {lock_path}: {e.strerror}",
            code="state_dir.no_locks",
            details=details,
        )
    return StateDirError(
        f"cannot lock {lock_path}: {e.strerror}", code="state_dir.unusable", details=details
    )
