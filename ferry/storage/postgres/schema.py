"""ferry's schema in PostgreSQL: versioned migrations, applied in order by ``db init``
(idempotent: under an advisory lock, each version once, in its own transaction).

The tables: ``ferry_tasks`` (one row per task: the folded task as JSON, plus the columns
the queries need), ``ferry_events`` (every event, in commit order of its sequence),
``ferry_hosts`` (one lease per host), ``ferry_groups`` (each group's ``jobs``, null
until ``group set``, and its own pause, null: it follows ``ferry_meta``'s
``paused_all``), ``ferry_log_tails`` (the last bytes of each attempt's log streams,
written with its SETTLED by the host that ran it, for ``ferry logs`` on the others).
A task's ``settled_at`` is when its row last became SUCCEEDED, FAILED or CANCELLED, by
the database's clock (``gc``'s ages). No fencing state lives in an UNLOGGED table: a
crash truncates those, and an epoch counter there would go back.
"""

from __future__ import annotations

import re
from typing import Any

from ferry.core.errors import DatabaseError

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
    # 4: claims in one round trip (PgStore.claim_next, PgStore.commit_against; docs/
    # postgres.md, "Claims"): the queue's rules, the pick (FOR UPDATE SKIP LOCKED), the
    # lease's epoch and the writes in one call. A function, not one statement: in READ
    # COMMITTED each of its statements reads a snapshot taken when it starts, so what it
    # reads after taking a lock (the groups' settings after the queue's lock, a group's
    # tasks in flight after the group's count lock) is what was committed before the
    # lock was granted; one statement reads its whole snapshot before it waits for any
    # lock. 1717924465 is queue.QUEUE_LOCK.
    """
    CREATE FUNCTION ferry_claim(p_host text, p_epoch bigint, p_tokens text[],
                                p_runners jsonb[], p_by text, p_ts double precision)
    RETURNS TABLE (claim_status text, claim_epoch bigint, claim_body jsonb)
    LANGUAGE plpgsql VOLATILE AS $claim$
    DECLARE
        v_claim integer;
        v_group record;
        v_id text;
        v_count bigint;
        v_epoch bigint;
        v_live boolean;
        v_checked boolean := p_epoch <= 0;  -- the lease checked (none to check: 0)
    BEGIN
        -- Shared: claimers do not wait for one another; group set, pause and resume
        -- take it exclusively, so the settings read below stay so until COMMIT.
        PERFORM pg_advisory_xact_lock_shared(1717924465);
        FOR v_claim IN 1 .. coalesce(array_length(p_tokens, 1), 0) LOOP
            v_id := NULL;
            -- The open groups (neither paused nor full) in the order of their best task
            -- that may run now (its time come, every dependency SUCCEEDED: one missing
            -- is not), read without locks; in that order, the first such task of the
            -- group that no other claimer holds, locked: one row, the claim's own.
            FOR v_group IN
                SELECT g.name, coalesce(g.jobs, 0) AS jobs
                FROM ferry_groups g CROSS JOIN LATERAL (
                    SELECT q.priority, q.queue_seq, q.id FROM ferry_tasks q
                    WHERE q.grp = g.name AND q.state = 'QUEUED'
                      AND (q.not_before IS NULL OR q.not_before <= extract(epoch FROM now()))
                      AND NOT EXISTS (
                          SELECT 1 FROM unnest(q.deps) AS dep
                          LEFT JOIN ferry_tasks d ON d.id = dep
                          WHERE d.id IS NULL OR d.state <> 'SUCCEEDED')
                    ORDER BY q.priority DESC, q.queue_seq, q.id
                    LIMIT 1
                ) head
                WHERE NOT coalesce(g.paused, (SELECT m.value = 'true' FROM ferry_meta m
                                              WHERE m.key = 'paused_all'))
                  AND (coalesce(g.jobs, 0) <= 0 OR g.jobs > (
                      SELECT count(*) FROM ferry_tasks r WHERE r.grp = g.name
                      AND r.state IN ('CLAIMED', 'DISPATCHING', 'RUNNING', 'STALE')
                      AND r.claimed_by IS DISTINCT FROM 'run'))
                ORDER BY head.priority DESC, head.queue_seq, head.id
            LOOP
                SELECT q.id INTO v_id FROM ferry_tasks q
                WHERE q.grp = v_group.name AND q.state = 'QUEUED'
                  AND (q.not_before IS NULL OR q.not_before <= extract(epoch FROM now()))
                  AND NOT EXISTS (
                      SELECT 1 FROM unnest(q.deps) AS dep LEFT JOIN ferry_tasks d ON d.id = dep
                      WHERE d.id IS NULL OR d.state <> 'SUCCEEDED')
                ORDER BY q.priority DESC, q.queue_seq, q.id
                LIMIT 1
                FOR UPDATE OF q SKIP LOCKED;
                CONTINUE WHEN v_id IS NULL;
                IF v_group.jobs > 0 THEN
                    -- A limited group: one claimer at a time counts its places, under its
                    -- count lock (as a commit's claim does: queue.lock_counts).
                    PERFORM pg_advisory_xact_lock(hashtextextended('count:' || v_group.name, 0));
                    SELECT count(*) INTO v_count FROM ferry_tasks r WHERE r.grp = v_group.name
                      AND r.state IN ('CLAIMED', 'DISPATCHING', 'RUNNING', 'STALE')
                      AND r.claimed_by IS DISTINCT FROM 'run';
                    IF v_count >= v_group.jobs THEN
                        v_id := NULL;
                        CONTINUE;
                    END IF;
                END IF;
                EXIT;
            END LOOP;
            EXIT WHEN v_id IS NULL;  -- nothing (more) to claim now
            IF NOT v_checked THEN
                -- The host's lease, FOR SHARE until COMMIT, before the first write: a
                -- claim under an epoch that is no longer the lease's, or after it
                -- expired, writes nothing.
                SELECT h.epoch, h.expires_at > now() INTO v_epoch, v_live
                FROM ferry_hosts h WHERE h.host_id = p_host FOR SHARE;
                IF v_epoch IS DISTINCT FROM p_epoch OR NOT coalesce(v_live, false) THEN
                    claim_status := 'fenced';
                    claim_epoch := v_epoch;
                    RETURN NEXT;
                    RETURN;
                END IF;
                v_checked := true;
            END IF;
            -- CLAIMED, and DISPATCHING for a task without pinned inputs (one with them
            -- is planned first: its DISPATCHING, or its SETTLED, is written after); the
            -- row as ferry.core.fold folds them (ferry.storage.claiming).
            RETURN QUERY
            WITH task AS (
                SELECT t.id, (t.body->>'attempt')::bigint AS attempt,
                       coalesce(jsonb_array_length(t.body->'spec'->'pointers'), 0) = 0
                           AS dispatch,
                       t.id || ':' || (t.body->>'attempt') || ':' || p_tokens[v_claim]
                           AS marker
                FROM ferry_tasks t WHERE t.id = v_id
            ), written AS (
                INSERT INTO ferry_events (epoch, ts, type, task, host, data)
                SELECT p_epoch, p_ts, e.type, task.id, p_host, e.data
                FROM task CROSS JOIN LATERAL (VALUES
                    (1, 'CLAIMED', jsonb_build_object('task', task.id, 'attempt',
                        task.attempt, 'token', p_tokens[v_claim], 'runner',
                        p_runners[v_claim], 'by', p_by)),
                    (2, 'DISPATCHING', jsonb_build_object('task', task.id, 'attempt',
                        task.attempt, 'token', p_tokens[v_claim], 'marker', task.marker,
                        'evidence', '{}'::jsonb))
                ) AS e(n, type, data)
                WHERE e.n = 1 OR task.dispatch
                ORDER BY e.n
                RETURNING seq
            ), folded AS (
                SELECT task.id, task.dispatch, task.marker,
                       CASE WHEN task.dispatch THEN 'DISPATCHING' ELSE 'CLAIMED' END AS state,
                       (SELECT max(written.seq) FROM written) AS seq
                FROM task
            )
            UPDATE ferry_tasks t SET
                state = folded.state, reason = NULL, host = p_runners[v_claim]->>'host_id',
                claimed_by = p_by, updated_seq = folded.seq, updated_at = now(),
                body = (t.body - ARRAY['pid', 'pgid', 'start_time', 'started_at',
                                       'heartbeat_at', 'cancel_requested', 'reason',
                                       'exit_code', 'signal', 'marker', 'claim_token',
                                       'runner', 'claimed_by'])
                    || jsonb_build_object('state', folded.state, 'claim_token',
                                          p_tokens[v_claim], 'runner', p_runners[v_claim],
                                          'claimed_by', p_by, 'updated_seq', folded.seq)
                    || CASE WHEN folded.dispatch
                            THEN jsonb_build_object('marker', folded.marker)
                            ELSE '{}'::jsonb END
            FROM folded WHERE t.id = folded.id
            RETURNING 'claimed'::text, p_epoch, t.body;
        END LOOP;
    END
    $claim$;
    """,
    # 5: the tail of each log stream, kept with the task's SETTLED for the other hosts
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
    # 6: a worker's write in one round trip (ferry.storage.postgres.optimistic): its
    # records, decided on the rows at the versions it last wrote or claimed them, and
    # its claims. Under the row locks, each row's version (updated_seq: a new seq at
    # every change of it) is compared with the one the decision was made on: any other
    # writes nothing ('moved', and the caller decides again on the rows locked); a
    # lease no longer at the epoch writes nothing ('fenced'). Otherwise what the
    # commit path writes: the events, the rows (each one's updated_seq its last
    # event's), the log tails, then ferry_claim, which sees them. One JSON argument
    # (optimistic.call says what it holds): a client adapts one value, where arrays
    # cost it more than the statement. Its statements' generic plans, always: with the
    # custom plans the plan cache chose for them, planning them again at every call
    # took a third of the server's time for the whole write.
    """
    CREATE FUNCTION ferry_write(p jsonb)
    RETURNS TABLE (write_status text, write_epoch bigint, write_seq bigint, write_body jsonb)
    LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan AS $write$
    DECLARE
        v_host text := p->>'host';
        v_epoch bigint := (p->>'epoch')::bigint;
        v_ts double precision := (p->>'ts')::float8;
        v_ids text[] := ARRAY(SELECT jsonb_array_elements_text(p->'ids'));
        v_seqs bigint[] := ARRAY(SELECT x::bigint FROM jsonb_array_elements_text(p->'seqs') x);
        v_tokens text[] := ARRAY(SELECT jsonb_array_elements_text(p->'tokens'));
        v_runners jsonb[] := ARRAY(SELECT jsonb_array_elements(p->'runners'));
        v_current bigint;
        v_live boolean;
        v_same integer;
        v_claim record;
    BEGIN
        IF v_epoch > 0 THEN
            SELECT h.epoch, h.expires_at > now() INTO v_current, v_live
            FROM ferry_hosts h WHERE h.host_id = v_host FOR SHARE;
            IF v_current IS DISTINCT FROM v_epoch OR NOT coalesce(v_live, false) THEN
                RETURN QUERY SELECT 'fenced'::text, v_current, NULL::bigint, NULL::jsonb;
                RETURN;
            END IF;
        END IF;
        -- Locked in id order (as the commit path locks them); a row locked after a
        -- wait is read as the writer that held it left it.
        SELECT count(*) INTO v_same FROM (
            SELECT t.id, t.updated_seq FROM ferry_tasks t WHERE t.id = ANY(v_ids)
            ORDER BY t.id FOR UPDATE OF t
        ) locked JOIN unnest(v_ids, v_seqs) AS x(id, seq)
            ON x.id = locked.id AND x.seq = locked.updated_seq;
        IF v_same <> cardinality(v_ids) THEN
            RETURN QUERY SELECT 'moved'::text, NULL::bigint, NULL::bigint, NULL::jsonb;
            RETURN;
        END IF;
        RETURN QUERY
        WITH written AS (
            INSERT INTO ferry_events (epoch, ts, type, task, host, data)
            SELECT v_epoch, v_ts, e.event->>'type', e.event->'data'->>'task', v_host,
                   e.event->'data'
            FROM jsonb_array_elements(p->'events') WITH ORDINALITY AS e(event, position)
            ORDER BY e.position
            RETURNING seq, task
        ), last AS (
            SELECT w.task, max(w.seq) AS seq FROM written w GROUP BY w.task
        ), rewritten AS (
            UPDATE ferry_tasks t SET
                state = r.state, reason = r.reason, host = r.host, queue_seq = r.queue_seq,
                not_before = r.not_before, claimed_by = r.claimed_by,
                updated_seq = last.seq,
                body = r.body || jsonb_build_object('updated_seq', last.seq),
                updated_at = now(),
                heartbeat_at = CASE WHEN r.state IN ('CLAIMED', 'DISPATCHING', 'RUNNING',
                                                     'STALE') THEN t.heartbeat_at END
            FROM jsonb_to_recordset(p->'rows') AS r(id text, state text, reason text,
                     host text, queue_seq bigint, not_before float8, claimed_by text,
                     body jsonb)
            JOIN last ON last.task = r.id
            WHERE t.id = r.id AND t.id = ANY(v_ids)
            RETURNING t.id
        )
        SELECT 'written'::text, NULL::bigint, w.seq, NULL::jsonb FROM written w ORDER BY w.seq;
        INSERT INTO ferry_log_tails (task, attempt, stream, host, size, tail)
        SELECT l.task, l.attempt, l.stream, v_host, l.size, decode(l.tail, 'hex')
        FROM jsonb_to_recordset(p->'tails') AS l(task text, attempt integer, stream text,
                                                 size bigint, tail text)
        ON CONFLICT DO NOTHING;
        IF cardinality(v_tokens) > 0 THEN
            FOR v_claim IN
                SELECT * FROM ferry_claim(v_host, v_epoch, v_tokens, v_runners, p->>'by', v_ts)
            LOOP
                IF v_claim.claim_status = 'fenced' THEN  -- (the lease was checked above)
                    RAISE EXCEPTION 'ferry_write: fenced after its lease was checked';
                END IF;
                RETURN QUERY SELECT v_claim.claim_status, v_claim.claim_epoch, NULL::bigint,
                                    v_claim.claim_body;
            END LOOP;
        END IF;
    END
    $write$;
    """,
    # 7: when each task settled, by the database's clock (``gc --older-than`` compares
    # it with the database's time: an end time a host wrote is its clock's, and a host
    # days behind had a task that ended a second ago forgotten). Stamped by the row's
    # own write, whichever statement or function makes it (a trigger: the commit path,
    # ferry_write, and what tests and older tools write alike), when the row becomes
    # SUCCEEDED, FAILED or CANCELLED; a late result or a resolve keeps it. The rows
    # settled before this version take the time of their last write (updated_at, the
    # database's clock too: their end or later, so never forgotten sooner).
    """
    ALTER TABLE ferry_tasks ADD COLUMN settled_at timestamptz;
    UPDATE ferry_tasks SET settled_at = updated_at
        WHERE state IN ('SUCCEEDED', 'FAILED', 'CANCELLED');
    CREATE FUNCTION ferry_settled_at() RETURNS trigger LANGUAGE plpgsql AS $settled$
    BEGIN
        NEW.settled_at := now();
        RETURN NEW;
    END
    $settled$;
    CREATE TRIGGER ferry_tasks_settled_new BEFORE INSERT ON ferry_tasks FOR EACH ROW
        WHEN (NEW.state IN ('SUCCEEDED', 'FAILED', 'CANCELLED'))
        EXECUTE FUNCTION ferry_settled_at();
    CREATE TRIGGER ferry_tasks_settled BEFORE UPDATE OF state ON ferry_tasks FOR EACH ROW
        WHEN (NEW.state IN ('SUCCEEDED', 'FAILED', 'CANCELLED')
              AND OLD.state NOT IN ('SUCCEEDED', 'FAILED', 'CANCELLED'))
        EXECUTE FUNCTION ferry_settled_at();
    """,
    # 8: every ``recover`` looks at the tasks whose orphans may run on: quarantined, and
    # FAILED HOST_LOST (their host's own probes can tell; ``PgStore.quarantined``).
    """
    DROP INDEX ferry_tasks_quarantined;
    CREATE INDEX ferry_tasks_quarantined ON ferry_tasks (id)
        WHERE reason IN ('HOST_LOST', 'QUARANTINED_ORPHAN_ALIVE');
    """,
)
VERSION = len(MIGRATIONS)
_LOCK_ID = 0x66657272  # "ferr": serialises concurrent `db init`s


def version(conn: Any) -> int:
    """The schema version in the database (0: none). A ``ferry_meta`` that holds no
    version ferry wrote (another application's table) is ``db.not_ferry``."""
    from psycopg import errors

    row = conn.execute("SELECT to_regclass('ferry_meta')::text").fetchone()
    if row[0] is None:
        return 0
    try:
        found = conn.execute("SELECT value FROM ferry_meta WHERE key = 'version'").fetchone()
    except (errors.UndefinedColumn, errors.UndefinedFunction, errors.DatatypeMismatch):
        found = None
    text = found[0] if found else None
    if not (isinstance(text, str) and re.fullmatch("0*[1-9][0-9]{0,8}", text)):
        raise _not_ferry(row[0])
    return int(text)


def migrate(conn: Any) -> tuple[int, int]:
    """Apply the missing migrations; (version before, version after). A schema newer
    than this ferry's is left as it is (``db.version``: upgrade ferry)."""
    from psycopg import errors

    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_ID,))
        before = version(conn)
        if before > VERSION:
            raise other_version(before)
        try:
            for number in range(before + 1, VERSION + 1):
                conn.execute(MIGRATIONS[number - 1])
                conn.execute(
                    "INSERT INTO ferry_meta (key, value) VALUES ('version', %s)"
                    " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                    (str(number),),
                )
        except errors.DuplicateTable as error:  # (another application's, of a ferry name)
            raise _not_ferry(_table_named(error)) from None
        except errors.InvalidSchemaName:  # (no schema of the search_path exists)
            raise DatabaseError(
                "the database has no schema to make ferry's tables in: its search_path"
                " (the role's, or the URL's options) names none that exists; create it"
                " (CREATE SCHEMA) or name another",
                code="db.no_schema",
            ) from None
    return before, VERSION


def other_version(found: int) -> DatabaseError:
    """``db.version``: the schema is ``found``, not this ferry's (what to do then)."""
    newer = found > VERSION
    return DatabaseError(
        f"the database's ferry schema is version {found}, {'newer' if newer else 'older'}"
        f" than this ferry's ({VERSION}): "
        + ("upgrade ferry" if newer else "run 'ferry --database URL db init' to upgrade it"),
        code="db.version",
        details={"version": found, "supported": VERSION},
    )


def _not_ferry(table: str) -> DatabaseError:
    return DatabaseError(
        f"the database's table {table} is not ferry's (another application's?): give"
        " ferry a database, or a schema (the URL's options=-csearch_path=...), of its own",
        code="db.not_ferry",
        details={"table": table},
    )


def _table_named(error: Exception) -> str:
    """The relation a DuplicateTable error names (its message: relation "x" ...)."""
    text = str(error)
    return text.split('"')[1] if text.count('"') >= 2 else "of ferry's name"
