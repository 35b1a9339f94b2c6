"""``ferry.storage.Leases`` on PostgreSQL: one lease per host (``ferry_hosts``), so that
the workers of many hosts claim at once while each host has one leader for its own
tasks (the recovery of what it ran, by its own probes).

Epochs come from one database sequence: every acquisition gets a new, higher one, on
any host. Times are the database's (``now()``), never a host's clock; the holder's own
deadline (``expires_boot_s``) is taken on its CLOCK_BOOTTIME *before* the statement
that set the expiry, so it always falls before the database's: a worker stops acting
before any other host may take its tasks over.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ferry.core.errors import LeaseHeldError
from ferry.proc.liveness import Liveness, probe
from ferry.proc.process import ProcessIdentity, boot_id
from ferry.storage.local.lease import Lease, LeaseLostError, boot_clock

if TYPE_CHECKING:
    from ferry.storage.postgres.connect import Database

_ROW = (
    "epoch, holder, extract(epoch FROM acquired_at), extract(epoch FROM renewed_at),"
    " extract(epoch FROM expires_at), extract(epoch FROM expires_at - now())"
)


_OF_ANOTHER_BOOT = (
    " of another boot: the boot before a reboot (until its lease expires), or another"
    " machine given this host id (cloned images share /etc/machine-id, the default):"
    " give each machine its own --host-id"
)


class PgLeases:
    def __init__(self, db: Database, host: str, ttl_s: float) -> None:
        self.db, self.host, self.ttl_s = db, host, ttl_s
        # A call hung on a silent network must end in time for the holder to see its
        # lease expire (on its own clock) and stop its tasks, before another host may
        # take them over (the lease's TTL after it expired).
        db.bound(ttl_s / 4)

    def _lease(self, row: Any, deadline_base: float | None = None) -> Lease:
        epoch, holder, acquired, renewed, expires, left = row
        base = boot_clock() if deadline_base is None else deadline_base
        return Lease(
            int(epoch), None if holder is None else ProcessIdentity.from_json(holder),
            float(acquired), float(renewed), float(expires),
            base + float(left) if deadline_base is None else base + self.ttl_s,
        )  # fmt: skip

    def read(self) -> Lease | None:
        row = self.db.execute(
            f"SELECT {_ROW} FROM ferry_hosts WHERE host_id = %s", (self.host,)
        ).fetchone()
        return None if row is None else self._lease(row)

    def acquire(self, me: ProcessIdentity, *, min_epoch: int = 0) -> Lease:
        """Take this host's lease with a new epoch, or raise ``lease.held`` (75) while
        another live holder has it (a holder of this boot proven dead is replaced at
        once; one of another boot, which no probe here can see, only by expiry)."""
        sent = boot_clock()
        with self.db.transaction() as conn:
            # The row exists before it is locked: a host's first two acquisitions at once
            # would otherwise each find no row to lock and both write one (two leaders).
            # This waits for a concurrent first insert and leaves nothing of its own.
            conn.execute(
                "INSERT INTO ferry_hosts (host_id, epoch, holder, acquired_at, renewed_at,"
                " expires_at) VALUES (%s, 0, NULL, now(), now(), now())"
                " ON CONFLICT (host_id) DO NOTHING",
                (self.host,),
            )
            row = conn.execute(
                f"SELECT {_ROW}, expires_at > now() FROM ferry_hosts WHERE host_id = %s FOR UPDATE",
                (self.host,),
            ).fetchone()
            if row is not None and row[1] is not None and row[-1]:
                current = self._lease(row[:-1])
                holder = current.holder
                # A holder of another boot: the boot before a reboot, or another machine
                # given this host id; no probe here can tell, so only by expiry.
                twin = holder not in (None, me) and holder.boot_id != boot_id()
                liveness = (
                    Liveness.DEAD if holder in (None, me)
                    else Liveness.UNKNOWN if twin else probe(holder)
                )  # fmt: skip
                if holder is not None and liveness is not Liveness.DEAD:
                    raise LeaseHeldError(
                        f"host {self.host}'s lease is held by pid {holder.pid}"
                        f" (epoch {current.epoch}){_OF_ANOTHER_BOOT if twin else ''}",
                        details={"holder": holder.to_json(), "epoch": current.epoch,
                                 "expires_at": current.expires_at,
                                 "holder_liveness": str(liveness), "host": self.host,
                                 **({"another_boot": True} if twin else {})},
                    )  # fmt: skip
            found = conn.execute(
                "INSERT INTO ferry_hosts AS h (host_id, epoch, holder, acquired_at, renewed_at,"
                " expires_at) VALUES (%s, greatest(nextval('ferry_epochs'), %s), %s, now(),"
                " now(), now() + make_interval(secs => %s))"
                " ON CONFLICT (host_id) DO UPDATE SET epoch = excluded.epoch,"
                " holder = excluded.holder, acquired_at = now(), renewed_at = now(),"
                f" expires_at = excluded.expires_at RETURNING {_ROW}",
                (self.host, min_epoch + 1, _jsonb(me.to_json()), self.ttl_s),
            ).fetchone()
        return self._lease(found, sent)

    def renew(self, lease: Lease) -> Lease:
        """Push the expiry out by the TTL, from the database's clock. ``lease.lost`` if
        it expired or another took it: the holder must stop acting as leader."""
        sent = boot_clock()
        row = self.db.execute(
            "UPDATE ferry_hosts SET renewed_at = now(),"
            " expires_at = now() + make_interval(secs => %s)"
            f" WHERE host_id = %s AND epoch = %s AND expires_at > now() RETURNING {_ROW}",
            (self.ttl_s, self.host, lease.epoch),
        ).fetchone()
        if row is None:
            raise LeaseLostError(
                f"host {self.host}'s lease epoch {lease.epoch} expired or was taken",
                details={"epoch": lease.epoch, "host": self.host},
            )
        return self._lease(row, sent)

    def release(self, lease: Lease) -> bool:
        row = self.db.execute(
            "UPDATE ferry_hosts SET holder = NULL, expires_at = now(), renewed_at = now()"
            " WHERE host_id = %s AND epoch = %s RETURNING 1",
            (self.host, lease.epoch),
        ).fetchone()
        return row is not None

    def led(self) -> bool:
        rows = self.db.execute(
            "SELECT host_id, holder, expires_at > now() FROM ferry_hosts WHERE holder IS NOT NULL"
        ).fetchall()
        return any(
            live
            or (host == self.host and probe(ProcessIdentity.from_json(holder)) is not Liveness.DEAD)
            for host, holder, live in rows
        )

    def reset(self, *, min_epoch: int) -> None:
        """Nothing to repair: the database keeps the lease readable."""
        return None


def _jsonb(data: Any) -> Any:
    from psycopg.types.json import Jsonb

    return Jsonb(data)
