"""``Journal.sync``: a decision that writes nothing ("that key already succeeded: not
run again") must not rest on a record a power cut can still take back.

A process that died between its write and its fdatasync leaves a record every other
handle reads (the page cache has it) but no disk may hold. ``sync`` (the append lock,
a catch-up, then an fdatasync of the active segment) makes it durable before the
caller acts on it. Checked with the simulated disk of ``test_journal_powercut``: from
the moment ``sync`` returns, the dead process's record is in every state a power cut
can leave; without the fdatasync it is not.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_journal_powercut import Driver, check_power_cuts, states_dir, trace

__all__ = ["states_dir"]  # (the fixture, used by name)


def read_then_sync(d: Driver) -> None:
    for i in range(3):
        d.append(i, h=i % 2)
    # Process 0 writes record 3 and dies before its fdatasync; process 1 reads it.
    d.die_mid_append([3], h=0, at="fdatasync", kind="file", after_write=True)
    d.handles[1].refresh()
    assert d.handles[1].last_seq == 4
    d.handles[1].sync()
    # From here on, acting on record 3 is safe: count it as committed.
    d.run.committed.append((len(d.run.sim.events), len(d.run.history)))
    d.append(4, h=1)


def test_a_record_read_from_a_dead_writer_is_durable_once_synced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, states_dir: Path
) -> None:
    run = trace(tmp_path, monkeypatch, read_then_sync, segment_bytes_max=1 << 20, handles=2)
    verdict = check_power_cuts(run, states_dir)
    assert verdict.cuts > 0 and not verdict.violations, verdict.violations[:5]


def test_without_its_fdatasync_sync_would_lose_the_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, states_dir: Path
) -> None:
    """The harness sees the difference: with the segment's syncs after the death
    skipped, a power cut after ``sync`` loses the record it vouched for."""
    died = {"yes": False}

    def skip(target: int | str) -> bool:
        return died["yes"] and isinstance(target, int)

    def workload(d: Driver) -> None:
        for i in range(3):
            d.append(i, h=i % 2)
        d.die_mid_append([3], h=0, at="fdatasync", kind="file", after_write=True)
        died["yes"] = True
        d.handles[1].refresh()
        d.handles[1].sync()
        d.run.committed.append((len(d.run.sim.events), len(d.run.history)))

    run = trace(tmp_path, monkeypatch, workload, 1 << 20, skip_sync=skip, handles=2)
    verdict = check_power_cuts(run, states_dir, stop_at_first=True)
    assert any("lost committed records" in v for v in verdict.violations), verdict.violations
