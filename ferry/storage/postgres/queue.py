"""The queue's part of the PostgreSQL backend (schema version 3): the claim candidates
in one query, the groups, the doomed dependants, and what a commit locks and reads to
check the queue's rules (``ferry.core.queue``) in its own transaction.

Serialisation, by transaction-scoped advisory locks taken before what they guard is
read: a claim (by ``claim`` or ``work``) takes the queue's lock, shared (in the
statement that checks its lease: claimers do not wait for each other, and it costs no
round trip); ``group set``, ``pause`` and ``resume`` take it exclusively, never
waiting for it (``lock``: a claim never waits behind them). So the
groups' settings cannot change between a claim's read of them (in the statement that
locks the claimed rows) and its COMMIT: a claim decided before a pause is the only kind
that commits after it. A claim in a group with a limit then takes that group's count
lock, exclusively, and counts the group's tasks in flight: two claimers on two hosts
cannot both take a group's last place, and claims in groups without a limit never
queue behind each other.
The rows of a DEPENDENCY_FAILED cancel's dependencies are locked ``FOR SHARE``: a
retry of the dependency (which locks its row) and the cancel are one after the other.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ferry.core import events as ev
from ferry.core.errors import DatabaseUnavailableError
from ferry.core.model import IN_FLIGHT_STATES

_IN_FLIGHT = sorted(state.value for state in IN_FLIGHT_STATES)
QUEUE_LOCK = 0x66657271  # "ferq": the whole queue (shared by claims)
_GROUP_SET = ev.EventType.GROUP_SET.value
_GROUP_EVENTS = {_GROUP_SET, ev.EventType.GROUP_PAUSED.value, ev.EventType.GROUP_RESUMED.value}

# The claim candidates: per group neither paused nor full, its best queued tasks whose
# time has come and whose dependencies all SUCCEEDED (in the order of the index
# ferry_tasks_claim_order: the scan stops at the group's room), then the best of those.
# Rows another claimer holds are skipped (SKIP LOCKED), as before queue control. Kept
# cheap to plan: ferry's statements are planned each time (psycopg drops its prepared
# statements at every ROLLBACK, and queued() ends in one), and planning the first form
# of this query cost more than running it. (A dependency that no longer exists counts
# as met here; the claim's own check, and doomed(), count it as failed.)
_CANDIDATES = """
SELECT c.body FROM (
    SELECT c.body, c.priority, c.queue_seq, c.id,
        row_number() OVER (PARTITION BY o.name ORDER BY c.priority DESC, c.queue_seq, c.id)
            AS place, o.room
    FROM (
        SELECT g.name, CASE WHEN coalesce(g.jobs, 0) > 0 THEN g.jobs
            - (SELECT count(*) FROM ferry_tasks r WHERE r.grp = g.name
               AND r.state IN ('CLAIMED', 'DISPATCHING', 'RUNNING', 'STALE')
               AND r.claimed_by IS DISTINCT FROM 'run')
            - coalesce((%(extra)s::jsonb ->> g.name)::bigint, 0) ELSE {limit} END AS room
        FROM ferry_groups g
        WHERE NOT coalesce(g.paused,
                           (SELECT value = 'true' FROM ferry_meta WHERE key = 'paused_all'))
        OFFSET 0
    ) o CROSS JOIN LATERAL (
        SELECT q.body, q.priority, q.queue_seq, q.id FROM ferry_tasks q
        WHERE q.grp = o.name AND q.state = 'QUEUED' AND o.room > 0
          AND (q.not_before IS NULL OR q.not_before <= extract(epoch FROM now()))
          AND q.id <> ALL(%(skip)s::text[])
          AND NOT EXISTS (
              SELECT 1 FROM ferry_tasks d WHERE d.id = ANY(q.deps) AND d.state <> 'SUCCEEDED')
        ORDER BY q.priority DESC, q.queue_seq, q.id
        LIMIT {limit}
        FOR UPDATE OF q SKIP LOCKED
    ) c
) c
WHERE c.place <= c.room
ORDER BY c.priority DESC, c.queue_seq, c.id
LIMIT {limit}
"""


def candidates(conn: Any, limit: int, skip: Sequence[str], extra: Mapping[str, int]) -> list[Any]:
    """The claim candidates' bodies, best first (times: the database's clock)."""
    from psycopg.types.json import Jsonb

    # The limit is written into the query, a constant: the planner then walks each
    # group's index in order and stops (with a LIMIT it cannot know, it chose to read
    # and sort a whole group once the table had statistics: the queue's length).
    rows = conn.execute(
        _CANDIDATES.format(limit=int(limit)),
        {"skip": list(skip), "extra": Jsonb(dict(extra))},
    ).fetchall()  # fmt: skip
    return [row[0] for row in rows]


def groups(conn: Any) -> list[dict[str, Any]]:
    """Each group set or with tasks queued or in flight (and ``default``)."""
    rows = conn.execute(
        "WITH settings AS (SELECT coalesce((SELECT value::boolean FROM ferry_meta"
        " WHERE key = 'paused_all'), false) AS paused_all),"
        " counts AS (SELECT grp, count(*) FILTER (WHERE state = 'QUEUED') AS queued,"
        " count(*) FILTER (WHERE state = ANY(%s) AND claimed_by IS DISTINCT FROM 'run')"
        " AS running FROM ferry_tasks WHERE state = ANY(%s) GROUP BY grp)"
        " SELECT g.name, coalesce(g.jobs, 0), coalesce(g.paused, s.paused_all),"
        " coalesce(c.queued, 0), coalesce(c.running, 0)"
        " FROM ferry_groups g CROSS JOIN settings s LEFT JOIN counts c ON c.grp = g.name"
        " WHERE g.jobs IS NOT NULL OR g.paused IS NOT NULL OR g.name = 'default'"
        " OR c.queued > 0 OR c.running > 0 ORDER BY g.name",
        (_IN_FLIGHT, [*_IN_FLIGHT, "QUEUED"]),
    ).fetchall()
    return [
        {"group": name, "jobs": int(jobs), "paused": bool(paused), "queued": int(queued),
         "running": int(running)}
        for name, jobs, paused, queued, running in rows
    ]  # fmt: skip


def doomed(conn: Any) -> list[tuple[Any, str]]:
    """(body, dependency) of each queued task to cancel DEPENDENCY_FAILED: a dependency
    FAILED, CANCELLED or missing, or itself doomed; dependencies first."""
    rows = conn.execute(
        "WITH RECURSIVE doomed(id, cause, depth) AS ("
        " SELECT q.id, min(dep), 0 FROM ferry_tasks q CROSS JOIN unnest(q.deps) AS dep"
        " LEFT JOIN ferry_tasks d ON d.id = dep"
        " WHERE q.state = 'QUEUED' AND q.deps <> '{}'"
        " AND (d.id IS NULL OR d.state IN ('FAILED', 'CANCELLED')) GROUP BY q.id"
        " UNION ALL"
        " SELECT q.id, doomed.id, doomed.depth + 1 FROM doomed JOIN ferry_tasks q"
        " ON q.deps @> ARRAY[doomed.id] AND q.state = 'QUEUED' AND q.deps <> '{}'"
        " WHERE doomed.depth < 10000)"
        " SELECT t.body, (array_agg(doomed.cause ORDER BY doomed.depth, doomed.cause))[1]"
        " FROM doomed JOIN ferry_tasks t USING (id)"
        " GROUP BY t.id, t.body ORDER BY min(doomed.depth), t.id"
    ).fetchall()
    return [(row[0], str(row[1])) for row in rows]


# ---- a commit's part ------------------------------------------------------------------


def lock(conn: Any, *, exclusive: bool) -> None:
    """The queue's advisory lock: shared by a claim (claimers do not wait for each
    other), exclusive for a group change (``group set``, ``pause``, ``resume``).

    Exclusive, it is never waited for: a request waiting for it would queue every
    later claim of every host behind it (the server grants locks in order), and a
    claimer frozen inside its claim (stopped between its ``ferry_claim`` and its
    COMMIT: the server ends it after a minute) would stall the whole fleet meanwhile.
    So a group change asks for it without waiting, again and again, and after
    ``EXCLUSIVE_WAIT_S`` gives up (``db.queue_busy``, 75; nothing written, the message
    naming who holds it)."""
    if not exclusive:
        conn.execute("SELECT pg_advisory_xact_lock_shared(%s)", (QUEUE_LOCK,))
        return
    deadline = time.monotonic() + EXCLUSIVE_WAIT_S
    pause_s = 0.001
    while not conn.execute("SELECT pg_try_advisory_xact_lock(%s)", (QUEUE_LOCK,)).fetchone()[0]:
        if time.monotonic() >= deadline:
            raise _busy(conn)
        time.sleep(pause_s)  # (claims hold it for a round trip: try again soon)
        pause_s = min(EXCLUSIVE_RETRY_S, pause_s * 2)


# A group change tries the queue's lock this long at most (claims hold it, shared, for
# a round trip each), every EXCLUSIVE_RETRY_S at most.
EXCLUSIVE_WAIT_S = 10.0
EXCLUSIVE_RETRY_S = 0.005


def _busy(conn: Any) -> DatabaseUnavailableError:
    """``db.queue_busy``: who holds the queue's lock (up to three sessions, the oldest
    transaction first: ferry's are named ``ferry <pid>@<host>``)."""
    holders = conn.execute(
        "SELECT a.application_name, a.pid, extract(epoch FROM clock_timestamp() - a.xact_start)::float8"
        " FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
        " WHERE l.locktype = 'advisory' AND l.granted AND l.classid = %s AND l.objid = %s"
        " AND l.objsubid = 1 AND l.pid <> pg_backend_pid()"
        " ORDER BY a.xact_start LIMIT 3",
        (QUEUE_LOCK >> 32, QUEUE_LOCK & 0xFFFFFFFF),
    ).fetchall()
    named = ", ".join(
        f"{name or 'a session'} (pid {pid}, in its transaction for {age or 0:.0f} s)"
        for name, pid, age in holders
    )
    return DatabaseUnavailableError(
        f"the queue's lock was held by claims for {EXCLUSIVE_WAIT_S:.0f} s"
        + (f" ({named})" if named else "")
        + ": nothing changed; a claimer stopped inside its claim holds it until the"
        " database ends its session (a minute at most): try again",
        code="db.queue_busy",
        details={"holders": [{"application_name": n, "pid": p} for n, p, _ in holders]},
    )


class ClaimFacts:
    """The claimed rows a commit locked (skipping those another claimer holds), and
    what their rules are checked against: their dependencies' rows, the groups'
    settings (a table snapshot's ``queue`` part; None: nothing claimed) and the
    database's time."""

    def __init__(
        self,
        rows: dict[str, Any],
        dependencies: dict[str, Any],
        settings: dict[str, Any] | None,
        now: float | None,
    ) -> None:
        self.rows, self.dependencies, self.settings, self.now = rows, dependencies, settings, now


def lock_claimed(conn: Any, ids: Sequence[str]) -> ClaimFacts:
    """Lock the claimed rows ``FOR UPDATE SKIP LOCKED``, and read their rules' facts in
    the same statement (no round trip of its own): its snapshot is taken after the
    queue's lock, so the settings it reads stay so until COMMIT."""
    if not ids:
        return ClaimFacts({}, {}, None, None)
    found = conn.execute(
        "SELECT t.id, t.body,"
        " (SELECT coalesce(jsonb_object_agg(d.id, d.body), '{}') FROM ferry_tasks d"
        "  WHERE d.id = ANY(t.deps)),"
        " extract(epoch FROM now())::float8,"
        " coalesce((SELECT value::boolean FROM ferry_meta WHERE key = 'paused_all'), false),"
        " (SELECT coalesce(jsonb_agg(jsonb_build_array(name, jobs, paused)), '[]')"
        "  FROM ferry_groups WHERE jobs IS NOT NULL OR paused IS NOT NULL)"
        " FROM ferry_tasks t WHERE t.id = ANY(%s) ORDER BY t.id FOR UPDATE OF t SKIP LOCKED",
        (list(ids),),
    ).fetchall()
    if not found:
        return ClaimFacts({}, {}, None, None)
    dependencies: dict[str, Any] = {}
    for row in found:
        dependencies.update(row[2])
    _, _, _, now, paused_all, settings = found[0]
    return ClaimFacts(
        {row[0]: row[1] for row in found},
        dependencies,
        {
            "jobs": {name: jobs for name, jobs, _ in settings if jobs is not None},
            "paused": {name: paused for name, _, paused in settings if paused is not None},
            "paused_all": bool(paused_all),
        },
        float(now),
    )


def lock_counts(conn: Any, groups: Iterable[str]) -> dict[str, Any]:
    """For a claim in limited ``groups``: each group's count lock (exclusive, in name
    order: one claimer at a time counts a limited group's places), then its tasks in
    flight, read once the locks are held."""
    names = sorted(set(groups))
    conn.execute(
        "SELECT count(pg_advisory_xact_lock(h)) FROM (SELECT hashtextextended('count:' || g, 0)"
        " AS h FROM unnest(%s::text[]) AS g ORDER BY g) AS ordered",
        (names,),
    )
    found = conn.execute(
        "SELECT id, body FROM ferry_tasks WHERE grp = ANY(%s) AND state = ANY(%s)",
        (names, _IN_FLIGHT),
    ).fetchall()
    return {row[0]: row[1] for row in found}


def rows(conn: Any, ids: Iterable[str], *, share: bool) -> dict[str, Any]:
    """The rows of ``ids`` (dependencies), locked FOR SHARE if ``share``."""
    wanted = sorted(set(ids))
    if not wanted:
        return {}
    suffix = " ORDER BY id FOR SHARE" if share else ""
    found = conn.execute(
        f"SELECT id, body FROM ferry_tasks WHERE id = ANY(%s){suffix}", (wanted,)
    ).fetchall()
    return {row[0]: row[1] for row in found}


def dependants(conn: Any, ids: Sequence[str]) -> dict[str, Any]:
    """The rows of the tasks not SUCCEEDED that come after any of ``ids``: each may be
    claimed, now or once retried (the waiting tasks' side and the in-flight side each
    an index's; the FAILED and CANCELLED, for ``gc`` only, read without one)."""
    found = conn.execute(
        "SELECT id, body FROM ferry_tasks"
        " WHERE state = 'QUEUED' AND deps <> '{}' AND deps && %(ids)s"
        " UNION ALL SELECT id, body FROM ferry_tasks"
        " WHERE state IN ('CLAIMED', 'DISPATCHING', 'RUNNING', 'STALE') AND deps && %(ids)s"
        " UNION ALL SELECT id, body FROM ferry_tasks"
        " WHERE state IN ('FAILED', 'CANCELLED') AND deps <> '{}' AND deps && %(ids)s",
        {"ids": list(ids)},
    ).fetchall()
    return {row[0]: row[1] for row in found}


def write_settings(conn: Any, batch: Iterable[tuple[str, Mapping[str, Any]]]) -> None:
    """The batch's GROUP_SET, GROUP_PAUSED and GROUP_RESUMED, into ``ferry_groups``."""
    for kind, data in batch:
        if kind not in _GROUP_EVENTS:
            continue
        name = data.get("group")
        if kind == _GROUP_SET:
            conn.execute(
                "INSERT INTO ferry_groups (name, jobs) VALUES (%s, %s)"
                " ON CONFLICT (name) DO UPDATE SET jobs = excluded.jobs",
                (name, data["jobs"]),
            )
            continue
        pause = kind == ev.EventType.GROUP_PAUSED.value
        if name is None:  # every group: each one's own setting forgotten
            conn.execute("UPDATE ferry_groups SET paused = NULL WHERE paused IS NOT NULL")
            conn.execute(
                "UPDATE ferry_meta SET value = %s WHERE key = 'paused_all'",
                ("true" if pause else "false",),
            )
            continue
        conn.execute(
            "INSERT INTO ferry_groups (name, paused) SELECT %(name)s,"
            " CASE WHEN %(pause)s = paused_all THEN NULL ELSE %(pause)s END FROM"
            " (SELECT coalesce((SELECT value::boolean FROM ferry_meta WHERE key = 'paused_all'),"
            " false) AS paused_all) s"
            " ON CONFLICT (name) DO UPDATE SET paused = excluded.paused",
            {"name": name, "pause": pause},
        )


def ensure_groups(conn: Any, names: Iterable[str]) -> None:
    """A row for each group a task is submitted in (the candidates query walks them)."""
    wanted = sorted(set(names) - {"default"})
    if wanted:
        conn.execute(
            "INSERT INTO ferry_groups (name) SELECT unnest(%s::text[]) ON CONFLICT DO NOTHING",
            (wanted,),
        )


def group_events(batch: Iterable[tuple[str, Mapping[str, Any]]]) -> list[tuple[str, Any]]:
    return [(kind, data.get("group")) for kind, data in batch if kind in _GROUP_EVENTS]
