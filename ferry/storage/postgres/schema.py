"""ferry's schema in PostgreSQL: versioned migrations, applied in order by ``db init``
(idempotent: under an advisory lock, each version once, in its own transaction).

The tables: ``ferry_tasks`` (one row per task: the folded task as JSON, plus the columns
the queries need), ``ferry_events`` (every event, in commit order of its sequence),
``ferry_hosts`` (one lease per host), ``ferry_groups`` (each group's ``jobs``, null
until ``group set``, and its own pause, null: it follows ``ferry_meta``'s
``paused_all``), ``ferry_log_tails`` (the last bytes of each attempt's log streams,
written with its SETTLED by the host that ran it, for ``ferry logs`` on the others). No fencing state lives in an UNLOGGED table: a
crash truncates those, and an epoch counter there would go back.
"""

from __future__ import annotations

from typing import Any

MIGRATIONS: tuple[str, ...] = (
    # 1: the first schema
    """
    CREATE TABLE ferry_meta (
        key text PRIMARY KEY,
        value text NOT NULL
    );
    CREATE TABLE ferry_tasks (
        id text PRIMARY KEY,
        state text NOT NULL,
        reason text,
        key text,
        host text,
        submit_seq bigint NOT NULL,
        queue_seq bigint NOT NULL,
        updated_seq bigint NOT NULL,
        heartbeat_at timestamptz,
        updated_at timestamptz NOT NULL DEFAULT now(),
        body jsonb NOT NULL
    );
    CREATE INDEX ferry_tasks_queued ON ferry_tasks (queue_seq, id) WHERE state = 'QUEUED';
    CREATE INDEX ferry_tasks_in_flight ON ferry_tasks (host)
        WHERE state IN ('CLAIMED', 'DISPATCHING', 'RUNNING', 'STALE');
    CREATE INDEX ferry_tasks_key ON ferry_tasks (key) WHERE key IS NOT NULL;
    CREATE INDEX ferry_tasks_quarantined ON ferry_tasks (id)
        WHERE reason = 'QUARANTINED_ORPHAN_ALIVE';
    CREATE TABLE ferry_events (
        seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        epoch bigint NOT NULL,
        ts double precision NOT NULL,
        type text NOT NULL,
        task text,
        host text,
        data jsonb NOT NULL
    );
    CREATE INDEX ferry_events_task ON ferry_events (task, seq);
    CREATE SEQUENCE ferry_epochs;
    CREATE TABLE ferry_hosts (
        host_id text PRIMARY KEY,
        epoch bigint NOT NULL,
        holder jsonb,
        acquired_at timestamptz NOT NULL,
        renewed_at timestamptz NOT NULL,
        expires_at timestamptz NOT NULL
    );
    """,
    # 2: task numbers (1, 2, 3, ... in submission order; contract.md, "Daily use")
    """
    CREATE SEQUENCE ferry_task_numbers;
    ALTER TABLE ferry_tasks ADD COLUMN number bigint;
    CREATE UNIQUE INDEX ferry_tasks_number ON ferry_tasks (number);
    """,
    # 3: queue control (contract.md, "Queue control and housekeeping"): a task's group,
    # priority, dependencies, not-before time and claimer as columns, for the claim
    # query (ferry.storage.postgres.queue) and its indexes; the groups' settings.
    """
    ALTER TABLE ferry_tasks ADD COLUMN grp text NOT NULL DEFAULT 'default';
    ALTER TABLE ferry_tasks ADD COLUMN priority bigint NOT NULL DEFAULT 0;
    ALTER TABLE ferry_tasks ADD COLUMN deps text[] NOT NULL DEFAULT '{}';
    ALTER TABLE ferry_tasks ADD COLUMN not_before double precision;
    ALTER TABLE ferry_tasks ADD COLUMN claimed_by text;
    UPDATE ferry_tasks SET claimed_by = body->>'claimed_by' WHERE body ? 'claimed_by';
    CREATE INDEX ferry_tasks_claim_order ON ferry_tasks (grp, priority DESC, queue_seq, id)
        WHERE state = 'QUEUED';
    CREATE INDEX ferry_tasks_group_in_flight ON ferry_tasks (grp)
        WHERE state IN ('CLAIMED', 'DISPATCHING', 'RUNNING', 'STALE');
    CREATE INDEX ferry_tasks_waiting ON ferry_tasks USING gin (deps)
        WHERE state = 'QUEUED' AND deps <> '{}';
    CREATE TABLE ferry_groups (
        name text PRIMARY KEY,
        jobs integer,
        paused boolean
    );
    INSERT INTO ferry_groups (name) VALUES ('default');
    DROP INDEX ferry_tasks_queued;  -- (the claim order's index replaces it)
    INSERT INTO ferry_meta (key, value) VALUES ('paused_all', 'false');
    ANALYZE ferry_groups;  -- (a handful of rows: without statistics the planner guesses 600)
    """,
    # 4: the tail of each log stream, kept with the task's SETTLED for the other hosts
    # (contract.md, "Many machines": the whole log stays on the host that ran it).
    """
    CREATE TABLE ferry_log_tails (
        task text NOT NULL,
        attempt integer NOT NULL,
        stream text NOT NULL,
        host text NOT NULL,
        size bigint NOT NULL,
        tail bytea NOT NULL,
        PRIMARY KEY (task, attempt, stream)
    );
    """,
)
VERSION = len(MIGRATIONS)
_LOCK_ID = 0x66657272  # "ferr": serialises concurrent `db init`s


def version(conn: Any) -> int:
    """The schema version in the database (0: none)."""
    row = conn.execute("SELECT to_regclass('ferry_meta') IS NOT NULL").fetchone()
    if not row[0]:
        return 0
    found = conn.execute("SELECT value FROM ferry_meta WHERE key = 'version'").fetchone()
    return 0 if found is None else int(found[0])


def migrate(conn: Any) -> tuple[int, int]:
    """Apply the missing migrations; (version before, version after)."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_ID,))
        before = version(conn)
        for number in range(before + 1, VERSION + 1):
            conn.execute(MIGRATIONS[number - 1])
            conn.execute(
                "INSERT INTO ferry_meta (key, value) VALUES ('version', %s)"
                " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (str(number),),
            )
    return before, VERSION
