"""Fencing end to end at the library level: the lease hands out epochs, the journal
refuses a write from an older epoch. A SIGSTOPped leader is replaced after its TTL and,
after SIGCONT, none of its writes are accepted and its renew fails."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ferry.core.errors import LeaseHeldError
from ferry.proc.process import read_stat, self_identity
from ferry.storage.local.lease import LeaseStore
from ferry.storage.local.statedir import ensure_home
from journal import Journal

pytestmark = pytest.mark.timeout(60)

OLD_LEADER = """
    import os, signal, sys
    from pathlib import Path
    from ferry.core.errors import FerryError
    from ferry.storage.local.lease import LeaseStore
    from ferry.proc.process import self_identity
    from journal import Journal, JournalError

    home = Path(sys.argv[1])
    leases = LeaseStore(home / "lease.json", ttl_s=0.5)
    wal = Journal.open(home / "journal")
    lease = leases.acquire(self_identity(), min_epoch=wal.max_epoch)
    wal.append("LEASE_ACQUIRED", {"by": "old"}, epoch=lease.epoch)
    print("leading", lease.epoch, flush=True)
    os.kill(os.getpid(), signal.SIGSTOP)  # the pause: outside the lease's short lock
    try:
        wal.append("CLAIMED", {"by": "old"}, epoch=lease.epoch)
        print("write accepted", flush=True)
    except JournalError as e:
        print("write refused", e.code, flush=True)
    try:
        leases.renew(lease)
        print("renewed", flush=True)
    except FerryError as e:
        print("renew refused", e.code, flush=True)
"""


def wait_until(condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met before the deadline")
        time.sleep(0.01)


def test_a_woken_leader_is_fenced(tmp_path: Path) -> None:
    home = Path(ensure_home(tmp_path / "home"))
    env = {k: v for k, v in os.environ.items() if k != "FERRY_FAILPOINTS"}
    old = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(OLD_LEADER), str(home)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert old.stdout is not None
        assert old.stdout.readline().split() == ["leading", "1"]
        wait_until(lambda: (st := read_stat(old.pid)) is not None and st.state in ("T", "t"))

        leases = LeaseStore(home / "lease.json", ttl_s=60.0)
        wal = Journal.open(home / "journal")
        me = self_identity()

        def take() -> bool:
            try:
                leases.acquire(me, min_epoch=wal.max_epoch)
            except LeaseHeldError:
                return False
            return True

        wait_until(take)  # hung, not dead: taken only after its TTL
        lease = leases.read()
        assert lease is not None and lease.epoch == 2
        # The new leader's first act: journal its epoch. From here on the old one is fenced.
        wal.append("LEASE_ACQUIRED", {"by": "new"}, epoch=lease.epoch)

        old.send_signal(signal.SIGCONT)
        out, _ = old.communicate(timeout=30)
        assert out.splitlines() == ["write refused journal.fenced", "renew refused lease.lost"]
        wal.refresh()
        records = [(r.epoch, r.type, r.data["by"]) for r in wal.read()]
        assert records == [(1, "LEASE_ACQUIRED", "old"), (2, "LEASE_ACQUIRED", "new")]
        wal.close()
    finally:
        if old.poll() is None:
            old.send_signal(signal.SIGCONT)
            old.kill()
        old.wait(timeout=30)
        if old.stdout is not None:
            old.stdout.close()


def test_ferry_fences_by_the_lease_before_the_successor_writes_anything(tmp_path: Path) -> None:
    """The journal itself fences only epochs it has seen written. A successor that took
    the lease but has not journaled yet (``recover`` and ``claim`` probe first) must
    fence the old leader all the same: ferry's store asks lease.json under the append
    lock. Writes that no leader makes (epoch 0: run, submit, cancel) are not fenced."""
    from ferry.core import events as ev
    from ferry.core.errors import FerryError
    from ferry.storage.local.store import Store

    home = Path(ensure_home(tmp_path / "home"))
    store = Store.open(home)
    leases = LeaseStore(home / "lease.json", ttl_s=60.0)
    me = self_identity()
    old = leases.acquire(me)
    store.commit(ev.LeaseAcquired(old.epoch, me.to_json()), epoch=old.epoch)
    new = leases.acquire(me)  # (the holder may take it again: a new epoch, nothing journaled)
    assert new.epoch == old.epoch + 1
    with pytest.raises(FerryError) as refused:
        store.commit(ev.LeaseAcquired(old.epoch, me.to_json()), epoch=old.epoch)
    assert refused.value.code == "journal.fenced"
    store.commit(ev.LeaseAcquired(new.epoch, me.to_json()), epoch=0)
    store.commit(ev.LeaseAcquired(new.epoch, me.to_json()), epoch=new.epoch)
    (home / "lease.json").write_bytes(b"garbage")  # unreadable: no leader may write
    with pytest.raises(FerryError) as unreadable:
        store.commit(ev.LeaseAcquired(new.epoch, me.to_json()), epoch=new.epoch)
    assert unreadable.value.code == "lease.unreadable"
    store.wal.close()
