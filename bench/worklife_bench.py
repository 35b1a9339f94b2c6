"""A long-lived `work`'s compactions, late in its life against early in the same run.

work-life   A store kept open as `ferry work` keeps it, in this process: waves of 125
            tasks settled (250 journal records), each followed
            by the compaction work does between its turns (`maybe_compact(merge=False)`),
            over 100,000 tasks. ours: the mean time of a compaction in the last 40
            waves; base: the mean in waves 40 to 80 (5,000 to 10,000 tasks into its
            life). Ratio ours/base (lower is better; target <= 1.5: what a compaction
            costs follows what changed since the last one, not how long work has run).
            Also printed: the archives the last snapshot names (each command reads
            their list), the settled tasks the table holds at the end, and the peak RSS.

Before this benchmark (2026-12-04, eighth session), the same loop measured 140 ms a
compaction at 125,000 tasks (each counted every settled task work held), 1,000
archives, and a table holding every task it settled.
"""

from __future__ import annotations

import os
import resource
import time

from benchkit import Figure, Options, scratch

WAVE_TASKS = 125
EARLY = slice(40, 80)


def work_life(options: Options) -> Figure:
    from ferry.core import events as ev
    from ferry.core.ids import new_task_id
    from ferry.core.model import Reason, State
    from ferry.core.spec import TaskSpec
    from ferry.storage.local.statedir import ensure_home
    from ferry.storage.local.store import Store
    from journal import _json, read_latest_snapshot

    waves = max(EARLY.stop + 40, int(100_000 * options.scale) // WAVE_TASKS)
    spec = TaskSpec(argv=("true",), cwd="/")
    with scratch("work-life") as directory:
        home = ensure_home(directory / "home")
        store = Store.open(home)
        try:
            costs = []
            for _ in range(waves):
                now = time.time_ns()
                ids = [new_task_id(now + i, os.urandom(4)) for i in range(WAVE_TASKS)]
                store.commit(*[ev.Submitted(i, spec, time.time()) for i in ids])
                store.commit(*[ev.Settled(i, 1, None, State.CANCELLED,
                                          Reason.CANCELLED_BY_USER) for i in ids])  # fmt: skip
                start = time.perf_counter()
                store.maybe_compact(merge=False)
                costs.append(time.perf_counter() - start)
            table = store.table
            if hasattr(table, "settled_held"):
                held = table.settled_held()
            else:  # (the code before it: for a comparison in one checkout)
                held = len(table._settled.ids())
        finally:
            store.close()
        snapshot = read_latest_snapshot(home / "journal")
        archives = len(_json.loads(snapshot.data)["settled_archives"]) if snapshot else 0
    late = costs[-40:]
    early = costs[EARLY]
    ours, base = sum(late) / len(late), sum(early) / len(early)
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return Figure(
        "work-life",
        ours / base,
        f"{ours * 1e3:.2f}ms",
        f"{base * 1e3:.2f}ms",
        {
            "tasks": str(waves * WAVE_TASKS),
            "target": "<=1.5",
            "archives": str(archives),
            "settled_held": str(held),
            "peak_rss": f"{rss_mib:.0f}MiB",
            "slowest": f"{max(costs) * 1e3:.0f}ms",
        },
    )


BENCHMARKS = {"work-life": work_life}
