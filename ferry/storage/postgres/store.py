"""``ferry.storage.TaskStore`` on PostgreSQL.

Every commit is one transaction that decides under the locks it takes, against the
rows as they are (never a table read earlier):

1. a leader's write (``epoch`` > 0) first checks, ``FOR SHARE``, that its host's lease
   still has that epoch and has not expired (by the database's clock): a worker paused
   past its lease is fenced (``journal.fenced``) and writes nothing;
2. the rows of the tasks it is about are locked ``FOR UPDATE`` (the rows it claims:
   ``SKIP LOCKED``, so two claimers never wait for each other: a row another claimer
   holds is refused at once, and that claimer takes the next task; its other rows are
   waited for, first); the keys it touches are serialised by transaction-scoped
   advisory locks (``lock_keys``: a bounded number, whatever the batch), and every task
   with such a key is read;
3. those rows are folded into a ``ferry.core.state.Table`` and the batch is validated
   by the same rules as the local journal (``ferry.core.fold``: the claim token of every
   write about a task in flight, the legal transitions, the key rules). A refusal rolls
   everything back: zero rows change, the writer is told why;
4. the events are inserted, folded, and the changed rows written back; COMMIT returns
   only once the database made it durable (``synchronous_commit``: checked at open).

Reads go to the database each time; ``refresh`` and ``sync`` have nothing to do (what a
read returns is committed, hence durable).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ferry.core import events as ev
from ferry.core.errors import (
    DatabaseError,
    DatabaseUnavailableError,
    FerryError,
    InternalError,
    LeaseHeldError,
    NotFoundError,
    RefusedError,
)
from ferry.core.fold import MAY_RUN_ON_VALUES, task_from_record, task_to_record
from ferry.core.ids import LAST, resolve_prefix, shown, task_number
from ferry.core.model import IN_FLIGHT_STATES, Reason, State, Task, replace, rfc3339
from ferry.core.state import SNAPSHOT_FORMAT, States, Table
from ferry.failpoints import failpoint
from ferry.storage import LEASE_TTL_S, Written
from ferry.storage.postgres import optimistic, queue, schema
from ferry.storage.postgres.connect import Database, application_name, host_id

if TYPE_CHECKING:
    from ferry.storage import Claimant, EncodedEvent, LogTailReader

_CLAIMED = ev.EventType.CLAIMED.value
_SETTLED = ev.EventType.SETTLED.value
_DEPENDENCY_FAILED = Reason.DEPENDENCY_FAILED.value
# (The reasons as constants, not parameters: the partial index of schema version 8 is
# the planner's only when it can prove its predicate.)
_MAY_RUN_ON_SQL = (
    "SELECT body FROM ferry_tasks WHERE reason IN ("
    + ", ".join(f"'{value}'" for value in sorted(MAY_RUN_ON_VALUES))
    + ") AND state = 'FAILED' ORDER BY id"
)
_SUBMITTED = ev.EventType.SUBMITTED.value
_FORGOTTEN = ev.EventType.FORGOTTEN.value
_TOMBSTONE = "key_succeeded:"  # ferry_meta's key for a key whose task gc forgot
_FILES = "gc_files:"  # ferry_meta: gc_files:<host>:<id>, a forgotten task's files on host
_IN_FLIGHT = [state.value for state in IN_FLIGHT_STATES]
_IS_IN_FLIGHT = "state IN ({})".format(", ".join(f"'{state}'" for state in sorted(_IN_FLIGHT)))
_TERMINAL = {State.SUCCEEDED.value, State.FAILED.value, State.CANCELLED.value}
_COLUMNS = "body"
_NOW = "SELECT extract(epoch FROM now())::float8"  # (the database's clock: its transaction's)
_CLAIM = "SELECT claim_status, claim_epoch, claim_body FROM ferry_claim(%s, %s, %s, %s, %s, %s)"
# One claim (``run``'s, and ``work``'s usual one: a slot came free): its token and runner
# sent as values, made arrays by the server. psycopg adapts an array in Python (a JSON
# runner's quotes escaped one by one): a third of the client's CPU for one claim.
_CLAIM_ONE = (
    "SELECT claim_status, claim_epoch, claim_body"
    " FROM ferry_claim(%s, %s, ARRAY[%s::text], ARRAY[%s::jsonb], %s, %s)"
)


def _task(row: Sequence[Any]) -> Task:
    return task_from_record(row[0])


class PgStore:
    """The tasks and events of one database, as seen from host ``host``."""

    def __init__(self, db: Database, host: str, log_tails: LogTailReader | None = None) -> None:
        """``log_tails``: reads an attempt's logs on this host, for the tails kept with
        its SETTLED (None: none kept)."""
        self.db = db
        self.host = host
        self.read_log_tails = log_tails
        self.known = optimistic.Known()  # (the rows a write in one call is decided on)

    @classmethod
    def open(
        cls, url: str, host: str | None = None, log_tails: LogTailReader | None = None
    ) -> PgStore:
        db = Database(url, host_id(host))
        db.check_durable()
        with db.mapped():
            found = schema.version(db.connection())
        if found == 0:
            raise DatabaseError(
                "the database has no ferry schema: run 'ferry --database URL db init' first",
                code="db.not_initialised",
            )
        if found != schema.VERSION:
            raise schema.other_version(found)
        return cls(db, db.host, log_tails)

    def close(self) -> None:
        self.db.close()

    def bound_calls(self) -> None:
        self.db.bound_statements()

    # ---- writing -------------------------------------------------------------------

    def commit(self, *events: ev.Event | EncodedEvent, epoch: int = 0) -> list[Any]:
        batch = self._encoded(events)
        if batch and all(kind == _FORGOTTEN for kind, _ in batch):
            self._forget(batch)
            return []
        ids = sorted({str(data["task"]) for _, data in batch if "task" in data})
        new_ids = {str(data["task"]) for kind, data in batch if kind == _SUBMITTED}
        claims = {str(data["task"]) for kind, data in batch if kind == _CLAIMED} - new_ids
        changes = queue.group_events(batch)
        self.known.forget(ids)
        with self.db.transaction() as conn:
            # The queue's advisory lock (queue module): shared by claims, taken with the
            # lease check (no round trip of its own); exclusive for a group change.
            claiming = bool(claims) and not changes
            others = [i for i in ids if i not in claims]
            if claiming or changes:
                if epoch > 0:
                    self._check_lease(conn, epoch, lock_queue=claiming)
                if changes or epoch <= 0:
                    queue.lock(conn, exclusive=bool(changes))
                rows = self._lock_tasks(conn, others)
            else:  # (the lease checked in the statement that locks the rows)
                rows = self._lock_tasks(conn, others, epoch=epoch)
            # SKIP LOCKED for the claimed rows only: another claimer holding one has
            # it (refused at once). The batch's other rows (a worker's ends) are waited
            # for: a claimer that picked one from the queue a moment before it was
            # claimed holds it until refused. They are locked first, in id order; the
            # claimed rows after them never wait.
            self._check_still_lost(conn, batch, rows)
            facts = queue.lock_claimed(conn, sorted(claims))  # (with their rules' facts)
            rows.update(facts.rows)
            taken = claims - set(rows)
            if taken and self._existing(conn, sorted(taken)):
                raise RefusedError(
                    f"task {sorted(taken)[0]} is being claimed by another worker",
                    code="task.stale_claim",
                    details={"task": sorted(taken)[0]},
                )
            records, _ = self._write_locked(conn, batch, epoch, ids, rows, facts)
        for record_type, _ in batch:
            failpoint("after:" + record_type)
        return records

    def commit_against(
        self,
        ids: Sequence[str],
        decide: Callable[[Mapping[str, Task | None]], Sequence[ev.Event | EncodedEvent]],
        *,
        epoch: int = 0,
        claims: Sequence[Claimant] = (),
        by: str = "work",
    ) -> Written:
        """Decided on the rows locked for the write (``FOR UPDATE``, in the statement
        that checks the lease): a cancel, a recovery decision or another host's write
        that committed before is seen, one after waits for this write. The claims: one
        call of ``ferry_claim`` in the same transaction (its count of a group's tasks in
        flight sees the ends just written); without records to write, that call alone,
        in autocommit (one round trip). Nothing to write: rolled back (row locks only:
        a COMMIT would wait for a WAL flush).

        First, when this process knows the rows (it wrote or claimed them last): decided
        on them and written in one call, which writes nothing if any row moved since
        (``optimistic``); then as above."""
        wanted = sorted(set(ids))
        if not wanted:
            return Written({}, self._claim_now(claims, by, epoch) if claims else [])
        known, announced = self._write_known(wanted, decide, epoch, claims, by)
        if known is not None:
            return known
        claimed: list[Task] = []
        try:
            with self.db.transaction() as conn:
                rows = self._lock_tasks(conn, wanted, epoch=epoch)
                current = {i: (task_from_record(rows[i]) if i in rows else None) for i in wanted}
                batch = self._encoded(decide(current))
                kinds = {kind for kind, _ in batch}
                if kinds & {_CLAIMED, _SUBMITTED, _FORGOTTEN} or queue.group_events(batch):
                    raise InternalError(f"commit_against writes no {sorted(kinds)}")
                after = dict(current)
                if batch:
                    more = sorted({str(d["task"]) for _, d in batch if "task" in d} - set(wanted))
                    rows.update(self._lock_tasks(conn, more))
                    every = sorted({*wanted, *more})
                    _, table = self._write_locked(
                        conn, batch, epoch, every, rows, None, announce=not announced
                    )
                    after = {task_id: table.get(task_id) for task_id in wanted}
                if claims:
                    if not announced:
                        failpoint("before:" + _CLAIMED)  # (inside the transaction)
                    claimed = self._claim(conn.execute, claims, by, epoch)
                if not batch and not claimed:
                    raise _NothingWritten(current)
        except _NothingWritten as nothing:
            return Written(nothing.tasks, [])
        for task in after.values():
            if task is not None:
                self.known.keep(task)
        for record_type, _ in batch:
            failpoint("after:" + record_type)
        _after_claims(claimed)
        return Written(after, claimed)

    def _write_known(
        self,
        wanted: list[str],
        decide: Callable[[Mapping[str, Task | None]], Sequence[ev.Event | EncodedEvent]],
        epoch: int,
        claims: Sequence[Claimant],
        by: str,
    ) -> tuple[Written | None, bool]:
        """``commit_against`` in one call of ``ferry_write``, decided on the rows as
        this process last wrote or claimed them (``optimistic``): what it wrote, and
        whether its ``before:`` failpoints were passed (one hit per write: the commit
        path does not pass them again). None written: a row not known, or moved since;
        a write that is not for one call; refused on the rows known: decide on the rows
        locked."""
        known = self.known.rows(wanted)
        if known is None:
            return None, False
        current: dict[str, Task | None] = {task_id: task for task_id, (_, task) in known.items()}
        batch = self._encoded(decide(current))
        if not optimistic.eligible(batch, known):
            return None, False
        table = _table({task_id: body for task_id, (body, _) in known.items()})
        try:
            table.validate_batch(batch)
        except FerryError:
            return None, False  # (refused there too, if the rows are as known)
        ts = time.time()
        for position, (kind, data) in enumerate(batch, 1):  # (its seqs: the function's)
            table.apply(kind, data, position, ts)
        changed: dict[str, Task] = {}
        for _, data in batch:
            task = table.get(str(data["task"]))
            assert task is not None  # (known, and none of these records removes it)
            changed[task.id] = task
        bodies = {task_id: task_to_record(task) for task_id, task in changed.items()}
        for record_type, _ in batch:  # (before the one statement: nothing sent yet)
            failpoint("before:" + record_type)
        if claims:
            failpoint("before:" + _CLAIMED)
        try:
            answer = optimistic.call(
                self.db.execute, _json, host=self.host, epoch=epoch,
                expected={task_id: task.updated_seq for task_id, (_, task) in known.items()},
                batch=batch, ts=ts, tails=self._log_tails(batch), claims=claims, by=by,
                rows=[optimistic.row(changed[i], body) for i, body in bodies.items()],
            )  # fmt: skip
        except Exception:
            self.known.forget(wanted)  # (its outcome unknown: read again next time)
            raise
        if answer.status == "fenced":
            raise _fenced(self.host, epoch, answer.epoch)
        if answer.status == "moved":
            self.known.forget(wanted)
            return None, True
        if len(answer.seqs) != len(batch):  # (cannot happen: an INSERT inserts them all)
            raise InternalError(f"{len(batch)} events sent, {len(answer.seqs)} inserted")
        after = dict(current)
        for task_id, body in bodies.items():
            seq = answer.seqs[changed[task_id].updated_seq - 1]
            after[task_id] = task = replace(changed[task_id], updated_seq=seq)
            self.known.keep(task, {**body, "updated_seq": seq})
        claimed = [self._claimed(body) for body in answer.claimed]
        for record_type, _ in batch:
            failpoint("after:" + record_type)
        _after_claims(claimed)
        return Written(after, claimed), True

    def _claimed(self, body: Any) -> Task:
        task = task_from_record(body)
        self.known.keep(task, body)
        return task

    def claim_next(
        self,
        runner: Mapping[str, Any],
        token: str,
        *,
        by: str,
        epoch: int,
        announce: Sequence[ev.Event] = (),
    ) -> Task | None:
        """One call of ``ferry_claim`` (schema version 4), in autocommit: one round trip,
        one transaction (``announce``: with the leader's LEASE_ACQUIRED inserted first,
        in the same transaction, rolled back if nothing is claimed). A connection lost
        meanwhile leaves the outcome unknown: DatabaseUnavailableError, and
        ``claimed_with`` finds out."""
        if not announce:
            claimed = self._claim_now([(runner, token)], by, epoch)
            return claimed[0] if claimed else None
        try:
            with self.db.transaction() as conn:
                self._insert_events(conn, [e.encode() for e in announce], epoch, time.time())
                failpoint("before:" + _CLAIMED)
                claimed = self._claim(conn.execute, [(runner, token)], by, epoch)
                if not claimed:
                    raise _NothingWritten({})
        except _NothingWritten:
            return None
        _after_claims(claimed)
        return claimed[0]

    def _claim_now(self, claims: Sequence[Claimant], by: str, epoch: int) -> list[Task]:
        """The claims in one call, in autocommit: one round trip, its own transaction."""
        failpoint("before:" + _CLAIMED)  # (nothing sent yet)
        claimed = self._claim(self.db.execute, claims, by, epoch)
        _after_claims(claimed)
        return claimed

    def _claim(
        self, execute: Callable[..., Any], claims: Sequence[Claimant], by: str, epoch: int
    ) -> list[Task]:
        """``ferry_claim`` for ``claims`` (their runners stamped with this host): the
        tasks claimed, in order; its lease fenced: nothing written, journal.fenced."""
        runners = [_json({"host_id": self.host, **runner}) for runner, _ in claims]
        tokens = [token for _, token in claims]
        one = len(claims) == 1
        rows = execute(
            _CLAIM_ONE if one else _CLAIM,
            (self.host, epoch, tokens[0] if one else tokens, runners[0] if one else runners,
             by, time.time()),
        ).fetchall()  # fmt: skip
        if rows and rows[-1][0] == "fenced":
            raise _fenced(self.host, epoch, rows[-1][1])
        return [self._claimed(row[2]) for row in rows]

    def claimed_with(self, token: str, *, writer_pid: int | None = None) -> Task | None:
        """Found by the host's tasks in flight (their index); not found is an answer only
        once no other connection of ``writer_pid`` is open (``connect.application_name``):
        the server ends a backend whose client went away once its statement is over,
        committed or not."""
        writer = None if writer_pid is None else application_name(writer_pid, self.host)
        row = self.db.execute(
            "SELECT (SELECT body FROM ferry_tasks WHERE host = %s AND state = ANY(%s)"
            " AND body->>'claim_token' = %s LIMIT 1), EXISTS (SELECT 1 FROM pg_stat_activity"
            " WHERE application_name = %s AND pid <> pg_backend_pid())",
            (self.host, _IN_FLIGHT, token, writer),
        ).fetchone()
        if row[0] is not None:
            return task_from_record(row[0])
        if row[1]:
            raise DatabaseUnavailableError(
                f"the outcome of claim {token} is not known yet: a connection of process"
                f" {writer_pid} that may have written it is still open",
                code="db.unavailable",
                details={"token": token},
            )
        return None

    def _encoded(self, events: Iterable[ev.Event | EncodedEvent]) -> list[EncodedEvent]:
        return [self._stamped(e if isinstance(e, tuple) else e.encode()) for e in events]

    def _write_locked(
        self,
        conn: Any,
        batch: Sequence[EncodedEvent],
        epoch: int,
        ids: Sequence[str],
        rows: dict[str, Any],
        facts: queue.ClaimFacts | None,
        *,
        announce: bool = True,
    ) -> tuple[list[Any], Table]:
        """Check ``batch`` against the locked ``rows`` (and what the rules need beyond
        them), then insert its events and write its tasks; the records and the table
        (``announce``: pass the ``before:`` failpoints, unless the write passed them
        already). A relative ``--not-before`` or retry delay (``wait_s``) is made a time
        here, by the database's clock (its ``now()``, this transaction's): the hosts'
        clocks do not decide when a task may be claimed (``ev.resolve_waits``)."""
        if any(ev.WAIT in data for _, data in batch):
            now = facts.now if facts is not None and facts.now is not None else None
            if now is None:
                now = float(conn.execute(_NOW).fetchone()[0])
            batch = ev.resolve_waits(batch, now)
        table = self._locked_table(conn, batch, rows, facts)
        table.validate_batch(batch, now=None if facts is None else facts.now)
        ts = time.time()  # (one for the batch: its records commit together)
        seqs = self._insert_events(conn, batch, epoch, ts)
        records = []
        numbers = iter(self._task_numbers(conn, batch))
        for (kind, data), seq in zip(batch, seqs, strict=True):
            if kind == _SUBMITTED:  # its number: the fold gives it submitted + 1
                table.submitted = next(numbers) - 1
            table.apply(kind, data, seq, ts)
            records.append((seq, epoch, kind, data))
        self._write_tasks(conn, [t for t in map(table.get, ids) if t is not None])
        self._keep_log_tails(conn, batch)
        queue.write_settings(conn, batch)
        submitted = [data["spec"].get("group") for kind, data in batch if kind == _SUBMITTED]
        queue.ensure_groups(conn, [group for group in submitted if group])
        # Inside the transaction, its row locks held, before COMMIT: a crash (or a
        # connection killed) here commits nothing.
        for record_type, _ in batch if announce else ():
            failpoint("before:" + record_type)
        return records, table

    def _locked_table(
        self,
        conn: Any,
        batch: Sequence[EncodedEvent],
        rows: Mapping[str, Any],
        facts: Any = None,
        extra: Mapping[str, Any] | None = None,
    ) -> Table:
        """The locked ``rows``, every task with a key the batch touches (each key's
        writers serialised: ``lock_keys``), those keys' tombstones and, for a
        batch with claims (``facts``: ``queue.lock_claimed``'s), what the queue's rules
        need (``_queue_part``), and ``extra`` rows, as a table the batch is checked
        against. Rows before keys: the dependencies' rows are locked (FOR SHARE) before
        the keys' locks are taken, as every writer locks its rows first (a batch that
        held keys while it waited for a row another writer held, that writer waiting for
        one of the keys, was a deadlock)."""
        related = dict(extra or {})
        if facts is not None:
            related.update(self._dependency_rows(conn, batch, rows))
        keys = self._keys_of(batch, rows)
        if keys:
            lock_keys(conn, keys)
        keyed = self._with_keys(conn, keys) if keys else {}
        if facts is not None:
            related.update(self._queue_part(rows, facts, conn))
        settings = None if facts is None else facts.settings
        return _table({**related, **keyed, **rows}, self._tombstones(conn, keys), settings)

    def _forget(self, batch: Sequence[EncodedEvent]) -> None:
        """``ferry gc``: the tasks' rows and events deleted in one transaction, on the rows
        locked and checked by the same rules as the journal's FORGOTTEN (settled, at the
        attempt gc read, not an unsafe key's latest task, none that a task not SUCCEEDED
        comes after). A key that SUCCEEDED with one
        of them keeps a tombstone (``ferry_meta``: ``key_succeeded:<key>``), so that it
        stays succeeded; the host that ran it gets a note (``gc_files:<host>:<id>``),
        until its gc has removed the task's files there (``forgotten_here``). Nothing
        else of the task is left: the database has no history to compact."""
        ids = sorted({str(data["task"]) for _, data in batch})
        with self.db.transaction() as conn:
            rows = self._lock_tasks(conn, ids)
            # (A task not SUCCEEDED that comes after one keeps it: Table._check_forget.)
            table = self._locked_table(conn, batch, rows, extra=queue.dependants(conn, ids))
            table.validate_batch(batch)
            notes = {}
            for task_id in ids:
                key = rows[task_id]["spec"].get("key")
                if key is not None and table.succeeded_with_key(key) == task_id:
                    notes[_TOMBSTONE + key] = task_id
                host = (rows[task_id].get("runner") or {}).get("host_id")
                if host is not None:  # (its files are on that host: for its gc to remove)
                    notes[f"{_FILES}{host}:{task_id}"] = ""
            if notes:
                conn.execute(
                    "INSERT INTO ferry_meta (key, value) SELECT * FROM jsonb_each_text(%s)"
                    " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                    (_json(notes),),
                )
            # (``last`` names the newest task submitted, forgotten or not: as locally.)
            numbers = [int(rows[i]["number"]) for i in ids if rows[i].get("number")]
            conn.execute(
                "INSERT INTO ferry_meta (key, value) VALUES ('numbers_forgotten', %s)"
                " ON CONFLICT (key) DO UPDATE"
                " SET value = greatest(ferry_meta.value::bigint, excluded.value::bigint)::text",
                (str(max(numbers, default=0)),),
            )
            conn.execute("DELETE FROM ferry_events WHERE task = ANY(%s)", (ids,))
            conn.execute("DELETE FROM ferry_log_tails WHERE task = ANY(%s)", (ids,))
            conn.execute("DELETE FROM ferry_tasks WHERE id = ANY(%s)", (ids,))
            failpoint("before:" + _FORGOTTEN)  # (inside the transaction: a crash commits nothing)
        failpoint("after:" + _FORGOTTEN)

    def _tombstones(self, conn: Any, keys: Sequence[str]) -> dict[str, str]:
        """Key -> the task, forgotten since, that SUCCEEDED with it."""
        if not keys:
            return {}
        rows = conn.execute(
            "SELECT key, value FROM ferry_meta WHERE key = ANY(%s)",
            ([_TOMBSTONE + key for key in keys],),
        ).fetchall()
        return {row[0][len(_TOMBSTONE) :]: row[1] for row in rows}

    def _dependency_rows(
        self, conn: Any, batch: Sequence[EncodedEvent], rows: Mapping[str, Any]
    ) -> dict[str, Any]:
        """The rows of a new task's dependencies and of a DEPENDENCY_FAILED cancel's,
        locked FOR SHARE: a gc deleting one waits, or is waited for (then it sees the
        new dependant and keeps the dependency; or the dependency is gone: refused); a
        retry of one waits."""
        wanted = self._dependencies(batch, rows, cancels=False)
        wanted |= self._dependencies(batch, rows, cancels=True)
        return queue.rows(conn, wanted, share=True)

    @staticmethod
    def _queue_part(rows: Mapping[str, Any], facts: Any, conn: Any) -> dict[str, Any]:
        """What the queue's rules need to judge a claim (``ferry.core.queue``) beyond
        the rows locked: its dependencies (read with the claimed rows) and, in a group
        with a limit, the group's tasks in flight, counted under its count lock."""
        related = dict(facts.dependencies)
        if facts.settings is not None:
            claimed = {rows[i]["spec"].get("group", "default") for i in facts.rows}
            limited = [group for group in claimed if facts.settings["jobs"].get(group)]
            if limited:
                related.update(queue.lock_counts(conn, limited))
        return related

    @staticmethod
    def _dependencies(
        batch: Sequence[EncodedEvent], rows: Mapping[str, Any], *, cancels: bool
    ) -> set[str]:
        """The dependencies of the tasks the batch submits (``cancels``: of those it
        cancels DEPENDENCY_FAILED)."""
        found: set[str] = set()
        for kind, data in batch:
            if not cancels and kind == _SUBMITTED:
                found.update(data["spec"].get("after", ()))
            elif cancels and kind == _SETTLED and data.get("reason") == _DEPENDENCY_FAILED:
                body = rows.get(str(data["task"]))
                if body is not None:
                    found.update(body["spec"].get("after", ()))
        return found

    def _task_numbers(self, conn: Any, batch: Sequence[EncodedEvent]) -> list[int]:
        """A number for each task the batch submits, in batch order (one sequence for
        every host: 1, 2, 3, ...; a write that dies leaves its numbers unused: a
        counter row would make every submit of every host wait for the commit of the
        one before, and a submit paused in its transaction stop them all)."""
        count = sum(1 for kind, _ in batch if kind == _SUBMITTED)
        if not count:
            return []
        found = conn.execute(
            "SELECT nextval('ferry_task_numbers') FROM generate_series(1, %s)", (count,)
        ).fetchall()
        return sorted(int(row[0]) for row in found)

    def _insert_events(
        self, conn: Any, batch: Sequence[EncodedEvent], epoch: int, ts: float
    ) -> list[int]:
        """The batch's events in one statement (not one round trip each), sent as one
        JSON array (an array of jsonb would be escaped element by element, in Python);
        their seqs, in batch order. The rows are inserted in the order of their position
        (ORDER BY), so the identity numbers them in that order: sorted, the seqs
        returned are the batch's, whatever order RETURNING gives them in."""
        if not batch:
            return []
        found = conn.execute(
            "INSERT INTO ferry_events (epoch, ts, type, task, host, data)"
            " SELECT %s, %s, e.event->>'type', e.event->'data'->>'task', %s, e.event->'data'"
            " FROM jsonb_array_elements(%s) WITH ORDINALITY AS e(event, position)"
            " ORDER BY e.position RETURNING seq",
            (epoch, ts, self.host, _json([{"type": kind, "data": data} for kind, data in batch])),
        ).fetchall()
        if len(found) != len(batch):  # (cannot happen: an INSERT inserts them all or fails)
            raise InternalError(f"{len(batch)} events sent, {len(found)} inserted")
        return sorted(row[0] for row in found)

    def _keep_log_tails(self, conn: Any, batch: Sequence[EncodedEvent]) -> None:
        """The batch's log tails (``_log_tails``), in the SETTLED's transaction."""
        tails = self._log_tails(batch)
        if tails:
            conn.execute(
                "INSERT INTO ferry_log_tails (task, attempt, stream, host, size, tail)"
                " SELECT l.task, l.attempt, l.stream, %s, l.size, decode(l.tail, 'hex')"
                " FROM jsonb_to_recordset(%s) AS l(task text, attempt integer, stream text,"
                " size bigint, tail text) ON CONFLICT DO NOTHING",
                (self.host, _json(tails)),
            )

    def _log_tails(self, batch: Sequence[EncodedEvent]) -> list[dict[str, Any]]:
        """The tails of the logs of each attempt the batch settles, as this host has
        them (none: the task did not run here), as rows of ``ferry_log_tails`` (the
        bytes in hex)."""
        if self.read_log_tails is None:
            return []
        return [
            {"task": data["task"], "attempt": data["attempt"], "stream": stream, "size": size,
             "tail": tail.hex()}
            for kind, data in batch if kind == _SETTLED
            for stream, (tail, size) in self.read_log_tails(data["task"], data["attempt"]).items()
        ]  # fmt: skip

    def _stamped(self, record: EncodedEvent) -> EncodedEvent:
        """A claim names the host of its runner (``host_id``): recovery is host-aware."""
        kind, data = record
        if kind == _CLAIMED and "host_id" not in data.get("runner", {}):
            data = {**data, "runner": {**data["runner"], "host_id": self.host}}
        return kind, data

    def _check_lease(self, conn: Any, epoch: int, *, lock_queue: bool = False) -> None:
        """The host's lease still has ``epoch`` (``lock_queue``: and, in the same
        statement, the queue's advisory lock, shared, as a claim takes it)."""
        lock = ", pg_advisory_xact_lock_shared(%s)" if lock_queue else ""
        row = conn.execute(
            f"SELECT epoch, expires_at > now(){lock} FROM ferry_hosts WHERE host_id = %s FOR SHARE",
            (queue.QUEUE_LOCK, self.host) if lock_queue else (self.host,),
        ).fetchone()
        if row is None or row[0] != epoch or not row[1]:
            raise _fenced(self.host, epoch, None if row is None else row[0])

    def _lock_tasks(self, conn: Any, ids: list[str], *, epoch: int = 0) -> dict[str, Any]:
        """The rows of ``ids``, locked ``FOR UPDATE`` in id order (waited for). ``epoch``:
        a leader's write: its host's lease is checked (``FOR SHARE``) in the same
        statement (no round trip of its own; on its own when no row is locked)."""
        if not ids:
            if epoch > 0:
                self._check_lease(conn, epoch)
            return {}
        if epoch <= 0:
            found = conn.execute(
                "SELECT id, body FROM ferry_tasks WHERE id = ANY(%s) ORDER BY id FOR UPDATE",
                (ids,),
            ).fetchall()
            return {row[0]: row[1] for row in found}
        found = conn.execute(
            "WITH lease AS MATERIALIZED (SELECT epoch, expires_at > now() AS live"
            " FROM ferry_hosts WHERE host_id = %s FOR SHARE)"
            " SELECT t.id, t.body, (SELECT epoch FROM lease), (SELECT live FROM lease)"
            " FROM ferry_tasks t WHERE t.id = ANY(%s) ORDER BY t.id FOR UPDATE OF t",
            (self.host, ids),
        ).fetchall()
        if not found:
            self._check_lease(conn, epoch)
        elif found[0][2] != epoch or not found[0][3]:
            raise _fenced(self.host, epoch, found[0][2])
        return {row[0]: row[1] for row in found}

    def _existing(self, conn: Any, ids: list[str]) -> bool:
        return bool(conn.execute("SELECT 1 FROM ferry_tasks WHERE id = ANY(%s)", (ids,)).fetchone())

    def _keys_of(self, batch: Iterable[EncodedEvent], rows: Mapping[str, Any]) -> list[str]:
        """The keys the batch touches: of a task submitted, and of every task locked."""
        keys = {body["spec"]["key"] for body in rows.values() if body["spec"].get("key")}
        for kind, data in batch:
            if kind == _SUBMITTED and data["spec"].get("key"):
                keys.add(str(data["spec"]["key"]))
        return sorted(keys)

    def _with_keys(self, conn: Any, keys: list[str]) -> dict[str, Any]:
        found = conn.execute("SELECT id, body FROM ferry_tasks WHERE key = ANY(%s)", (keys,))
        return {row[0]: row[1] for row in found.fetchall()}

    def _write_tasks(self, conn: Any, tasks: Sequence[Task]) -> None:
        """The batch's tasks as they are now, in one statement (each id once), sent as
        one JSON array of rows."""
        if not tasks:
            return
        rows = [optimistic.row(task) for task in tasks]
        conn.execute(
            "INSERT INTO ferry_tasks (id, state, reason, key, host, submit_seq, queue_seq,"
            " updated_seq, body, number, grp, priority, deps, not_before, claimed_by)"
            " SELECT * FROM jsonb_to_recordset(%s) AS t(id text,"
            " state text, reason text, key text, host text, submit_seq bigint,"
            " queue_seq bigint, updated_seq bigint, body jsonb, number bigint, grp text,"
            " priority bigint, deps text[], not_before float8, claimed_by text)"
            " ON CONFLICT (id) DO UPDATE SET state = excluded.state, reason = excluded.reason,"
            " host = excluded.host, queue_seq = excluded.queue_seq,"
            " not_before = excluded.not_before, claimed_by = excluded.claimed_by,"
            " updated_seq = excluded.updated_seq, body = excluded.body, updated_at = now(),"
            " heartbeat_at = CASE WHEN excluded.state = ANY(%s) THEN ferry_tasks.heartbeat_at"
            " END",
            (_json(rows), _IN_FLIGHT),
        )

    def beat(self, task: Task) -> bool:
        """The task's supervisor is alive (``host_lost`` reads it). Fenced by the claim
        token alone: a task outlives its worker and its host's lease (``run`` holds
        none). False: the claim moved."""
        row = self.db.execute(
            "UPDATE ferry_tasks SET heartbeat_at = now() WHERE id = %s"
            " AND state = ANY(%s) AND body->>'claim_token' = %s RETURNING 1",
            (task.id, _IN_FLIGHT, task.claim_token),
        ).fetchone()
        return row is not None

    def refresh(self) -> None:
        """Reads are of the database itself: nothing to catch up with."""

    def sync(self, within_s: float | None = None) -> bool:
        """What a read returns was committed, hence durable: nothing to do."""
        return True

    # ---- reading -------------------------------------------------------------------

    def _tasks(self, sql: str, params: Sequence[Any] = ()) -> list[Task]:
        return [_task(row) for row in self.db.execute(sql, params).fetchall()]

    def get(self, task_id: str) -> Task | None:
        found = self._tasks("SELECT body FROM ferry_tasks WHERE id = %s", (task_id,))
        return found[0] if found else None

    def resolve(self, prefix: str) -> Task:
        number = task_number(prefix)
        if prefix == LAST or number is not None:
            named = self._numbers_given() if number is None else number
            found = self._tasks("SELECT body FROM ferry_tasks WHERE number = %s", (named,))
            if not found:
                none_yet = " (none submitted yet)" if not self._numbers_given() else ""
                raise NotFoundError(
                    f"no task {shown(prefix)}{none_yet}", details={"prefix": prefix}
                )
            return found[0]
        exact = self.get(prefix)
        if exact is not None:
            return exact
        wanted = prefix.strip().lower()
        pattern = wanted.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        rows = self.db.execute(
            "SELECT id, count(*) OVER () FROM ferry_tasks WHERE id LIKE %s ORDER BY id LIMIT 12",
            (pattern,),
        ).fetchall()
        task = self.get(resolve_prefix(prefix, [row[0] for row in rows],
                                       count=int(rows[0][1]) if rows else 0))  # fmt: skip
        assert task is not None
        return task

    def _numbers_given(self) -> int:
        """The number of the newest task submitted (0: none), whether or not gc forgot
        it since (its mark in ``ferry_meta``): ``last``'s."""
        row = self.db.execute(
            "SELECT greatest((SELECT max(number) FROM ferry_tasks),"
            " (SELECT value::bigint FROM ferry_meta WHERE key = 'numbers_forgotten'))"
        ).fetchone()
        return 0 if row is None or row[0] is None else int(row[0])

    def live(self) -> list[Task]:
        return self._tasks(
            "SELECT body FROM ferry_tasks WHERE state = ANY(%s) ORDER BY submit_seq",
            ([*_IN_FLIGHT, State.QUEUED.value],),
        )

    def in_flight(self) -> list[Task]:
        # (The states written out, not a parameter: the partial index on in-flight rows
        # is then usable in every plan, generic ones included.)
        return self._tasks(
            f"SELECT body FROM ferry_tasks WHERE {_IS_IN_FLIGHT} ORDER BY submit_seq"
        )

    def newest(self, limit: int, state: States = None) -> list[Task]:
        where = "" if state is None else "WHERE state = ANY(%(states)s)"
        bound = "" if not limit else "LIMIT %(limit)s"
        found = self._tasks(
            f"SELECT body FROM ferry_tasks {where} ORDER BY submit_seq DESC, id DESC {bound}",
            {"states": _state_list(state), "limit": limit},  # type: ignore[arg-type]
        )
        return found[::-1]

    def count(self, state: States = None) -> int:
        where = "" if state is None else "WHERE state = ANY(%s)"
        row = self.db.execute(
            f"SELECT count(*) FROM ferry_tasks {where}",
            () if state is None else (_state_list(state),),
        )
        return int(row.fetchone()[0])

    def queued(
        self,
        limit: int,
        *,
        skip: Collection[str] = (),
        extra: Mapping[str, int] | None = None,
    ) -> list[Task]:
        """Claim candidates in claim order, under the queue's gates, skipping rows
        another claimer holds now: one query (``queue._CANDIDATES``: per open group,
        the head of its index ``ferry_tasks_claim_order``; a MATERIALIZED CTE, so the
        planner cannot re-run the LIMIT and lock more rows). Times are the database's.

        The locks are only for SKIP LOCKED and are let go at once, by a rollback: a row
        lock gives the transaction an id, and its COMMIT would wait for a WAL flush
        (as long as a claim's own) for nothing durable."""
        with self.db.transaction(rollback=True) as conn:
            bodies = queue.candidates(conn, limit, sorted(skip), extra or {})
        return [task_from_record(body) for body in bodies]

    def groups(self) -> list[dict[str, Any]]:
        with self.db.transaction(rollback=True) as conn:  # (a read: errors mapped)
            return queue.groups(conn)

    def doomed(self) -> list[tuple[Task, str]]:
        with self.db.transaction(rollback=True) as conn:
            found = queue.doomed(conn)
        return [(task_from_record(body), cause) for body, cause in found]

    def quarantined(self) -> list[Task]:
        """Quarantined tasks, and those FAILED ``HOST_LOST`` (decided by another host:
        their orphans may run on, and only their own host's probes can tell)."""
        return self._tasks(_MAY_RUN_ON_SQL, ())

    def succeeded_with_key(self, key: str) -> str | None:
        rows = self.db.execute("SELECT id, body FROM ferry_tasks WHERE key = %s", (key,))
        found = _table({row[0]: row[1] for row in rows.fetchall()}).succeeded_with_key(key)
        if found is None:  # (its task forgotten by gc: the tombstone says so)
            return self._tombstones(self.db, [key]).get(key)
        return found

    def settled_before(self, seconds: float, states: Iterable[str]) -> list[Task]:
        """Settled tasks in ``states`` that settled before ``seconds`` by the database's
        clock (``settled_at``, stamped by the write that settled the row: schema version
        7; ``seconds`` from ``now``); every host's (their rows are shared; their logs
        are each host's). Not the task's ``ended_at``: its host's clock wrote that."""
        wanted = sorted(set(states) & _TERMINAL)
        return self._tasks(
            "SELECT body FROM ferry_tasks WHERE state = ANY(%s)"
            " AND coalesce(settled_at, updated_at) < to_timestamp(%s)"
            " ORDER BY submit_seq, id",
            (wanted, seconds),
        )

    def now(self) -> float:
        """The database's time: its clock decides (a host's may be wrong)."""
        return float(self.db.execute(_NOW).fetchone()[0])

    def forgotten_here(self) -> list[str]:
        """The tasks this host ran that gc forgot and whose files this host has not
        removed yet (``_forget`` notes each, in its transaction)."""
        prefix = f"{_FILES}{self.host}:"
        rows = self.db.execute(
            "SELECT key FROM ferry_meta WHERE starts_with(key, %s) ORDER BY key", (prefix,)
        ).fetchall()
        return [row[0][len(prefix) :] for row in rows]

    def files_removed(self, task_ids: Iterable[str]) -> None:
        keys = [f"{_FILES}{self.host}:{task_id}" for task_id in task_ids]
        if keys:
            self.db.execute("DELETE FROM ferry_meta WHERE key = ANY(%s)", (keys,))

    @property
    def highest_epoch(self) -> int:
        row = self.db.execute("SELECT coalesce(max(epoch), 0) FROM ferry_hosts").fetchone()
        return int(row[0])

    # ---- hosts ----------------------------------------------------------------------

    def log_tails(self, task_id: str, attempt: int) -> dict[str, tuple[bytes, int]]:
        found = self.db.execute(
            "SELECT stream, tail, size FROM ferry_log_tails WHERE task = %s AND attempt = %s",
            (task_id, attempt),
        ).fetchall()
        return {str(stream): (bytes(tail), int(size)) for stream, tail, size in found}

    def host_lost(self, task: Task, ttl_s: float) -> bool | None:
        """Whose task is it to decide? None: this host's (decide by probes). True: its
        host lost its lease at least ``ttl_s`` ago (its workers, unable to renew, have
        stopped their tasks) and the task has gone unheard (no claim, intent or beat of
        it taken) for twice the TTL its runner promised (``runner.beat_ttl_s``; or
        ``ttl_s``, if longer), twice its ``--kill-grace`` and a slack: its
        supervisor, unheard for one TTL, stopped it (SIGTERM, SIGKILL after the grace;
        then what left its group, the same way), and had the rest to see it gone.
        Decide it as lost. False: another host's, still alive: leave it alone.

        A task of this host id whose runner is of another boot is judged so too, by
        what is heard of it alone (this host's lease is its own now): a task from
        before a reboot is lost once unheard; one of another machine given the same
        host id (a cloned image's machine id) beats, and no probe here could see it.
        Asked only whose it is (``ttl_s`` infinite), such a task is this host's once
        settled, or unheard that long by the default TTL: nothing of the boot before
        runs, and the host acts on it by its probes (``retry``, ``kill``, ``gc``)."""
        from ferry.proc.process import boot_id

        runner = task.runner or {}
        owner = runner.get("host_id")
        if owner is None or (owner == self.host and runner.get("boot_id") == boot_id()):
            return None
        if owner == self.host:  # (of another boot)
            if ttl_s != float("inf"):
                return _lost(self.db.execute, task.id, None, ttl_s)
            if task.terminal or _lost(self.db.execute, task.id, None, LEASE_TTL_S):
                return None
            return False
        if ttl_s == float("inf"):
            return False  # (asked only whose task it is)
        return _lost(self.db.execute, task.id, owner, ttl_s)

    def _check_still_lost(
        self, conn: Any, batch: Sequence[EncodedEvent], rows: Mapping[str, Any]
    ) -> None:
        """A decision that another host was lost (``recover``: its evidence names the
        TTL it was judged by) is judged again on the row as locked for its write: the
        host may be back since ``host_lost`` was read (a beat of its task, its SPAWNED),
        and the task then is that host's again. Refused: task.heard_again."""
        for _, data in batch:
            recovery = (data.get("evidence") or {}).get("recovery") or {}
            ttl_s = recovery.get("host_ttl_s") if recovery.get("host_lost") else None
            if ttl_s is None:
                continue
            task_id = str(data["task"])
            owner = str(((rows.get(task_id) or {}).get("runner") or {}).get("host_id"))
            judged_by = None if owner == self.host else owner  # (another boot of this host)
            if not _lost(conn.execute, task_id, judged_by, float(ttl_s)):
                raise RefusedError(
                    f"task {task_id} was heard from since host {owner} was judged lost:"
                    " it is that host's again",
                    code="task.heard_again",
                    details={"task": task_id, "host": owner},
                )

    # ---- housekeeping --------------------------------------------------------------

    def maybe_compact(
        self, *, merge: bool = True, unless_led: bool = False
    ) -> dict[str, Any] | None:
        """The database keeps its own house (autovacuum): nothing is ever due here."""
        return None

    def compact(
        self, *, wait: bool = True, on_lock_wait: Callable[[], None] | None = None
    ) -> dict[str, Any] | None:
        return {"snapshot_seq": None, "removed": [], "archives": 0}

    def status(self) -> dict[str, Any]:
        """``db status``: the schema, the tasks by state, the hosts and their leases."""
        with self.db.mapped():
            conn = self.db.connection()
            counts = dict(conn.execute("SELECT state, count(*) FROM ferry_tasks GROUP BY state"))
            hosts = conn.execute(
                "SELECT host_id, epoch, holder, renewed_at, expires_at, expires_at > now()"
                " FROM ferry_hosts ORDER BY host_id"
            ).fetchall()
            version = schema.version(conn)
        return {
            "schema_version": version,
            "host": self.host,
            "tasks": {state: counts.get(state, 0) for state in sorted(counts)},
            "hosts": [
                {
                    "host": h,
                    "epoch": e,
                    "holder": holder,
                    "renewed_at": _iso(r),
                    "expires_at": _iso(x),
                    "live": bool(live),
                }
                for h, e, holder, r, x, live in hosts
            ],
        }


class _NothingWritten(Exception):
    """Leaves a transaction that found nothing to write (rolled back)."""

    def __init__(self, tasks: dict[str, Task | None]) -> None:
        super().__init__("nothing written")
        self.tasks = tasks


# The keys' locks (transaction-scoped advisory locks; schema version 7). A write of a
# few keys takes each key's own lock, exclusive (its 64-bit hash: one key space), under
# its bucket's lock, shared; a write of more takes the buckets' locks, exclusive (a
# space of two 32-bit keys: KEY_SPACE and the bucket, KEY_BUCKETS of them). So writers
# of one key go one after the other; writers of a few keys of one bucket do not wait
# for each other; and a batch of any size takes KEY_BUCKETS locks at most (one per
# key overflowed the server's lock table, max_locks_per_transaction times
# max_connections: "out of shared memory" at about 24,000 keys on a test server, under
# 7,000 on a stock one). Every writer takes buckets in ascending order, each before any
# key lock, and the rows it reads (FOR UPDATE, FOR SHARE) before both: no cycle among
# these locks and rows.
KEY_SPACE = 0x6665726B  # "ferk"
KEY_BUCKETS = 256
# More keys than this in one write: the buckets, exclusive (a few hundred locks at most,
# where one a key would take many of the server's; but a batch holding its buckets
# holds up the other writers of keys in them, until it commits).
KEYS_ONE_BY_ONE = 64
_BUCKETS = (
    f"SELECT DISTINCT (hashtextextended(k, 0) & {KEY_BUCKETS - 1})::int4 AS b"
    " FROM unnest(%(keys)s::text[]) AS k ORDER BY b"
)
# (The buckets' shared locks in a one-time filter, taken before any row of the keys is
# read; then each key's lock, in the order of their hashes.)
_LOCK_KEYS = (
    "SELECT count(pg_advisory_xact_lock(h)) FROM (SELECT hashtextextended(k, 0) AS h"
    " FROM unnest(%(keys)s::text[]) AS k ORDER BY h) AS keys"
    " WHERE (SELECT count(pg_advisory_xact_lock_shared(%(space)s, b))"
    f" FROM ({_BUCKETS}) AS buckets) >= 0"
)
_LOCK_BUCKETS = f"SELECT count(pg_advisory_xact_lock(%(space)s, b)) FROM ({_BUCKETS}) AS buckets"


def lock_keys(conn: Any, keys: Sequence[str]) -> None:
    """Serialise the writers of ``keys`` (in one statement, whatever their number)."""
    sql = _LOCK_KEYS if len(keys) <= KEYS_ONE_BY_ONE else _LOCK_BUCKETS
    conn.execute(sql, {"keys": list(keys), "space": KEY_SPACE})


def _lost(execute: Callable[..., Any], task_id: str, owner: str | None, ttl_s: float) -> bool:
    """``PgStore.host_lost``'s judgement, in one statement (``execute``: the store's, or
    a transaction's after it locked the row). ``owner`` None: by the task's beats alone
    (this host id's task of another boot)."""
    from ferry.proc.supervise import DRAIN_TIMEOUT_S, SIGKILL_WAIT_S

    # (a stopped group may take this long to be gone after its SIGKILL, its pipes
    # drained, before what left the group gets a grace of its own; and a second)
    slack_s = SIGKILL_WAIT_S + DRAIN_TIMEOUT_S + 1.0
    row = execute(
        "SELECT coalesce((SELECT expires_at FROM ferry_hosts WHERE host_id = %s),"
        " '-infinity') < now() - make_interval(secs => %s),"
        " coalesce(heartbeat_at, updated_at) < now() - make_interval(secs =>"
        " 2 * greatest(%s, (body->'runner'->>'beat_ttl_s')::float8)"
        " + 2 * coalesce((body->'spec'->>'kill_grace_s')::float8, 0) + %s)"
        " FROM ferry_tasks WHERE id = %s",
        (owner, ttl_s, ttl_s, slack_s, task_id),
    ).fetchone()
    return bool(row is not None and row[0] and row[1])


def _after_claims(claimed: Sequence[Task]) -> None:
    for task in claimed:
        failpoint("after:" + _CLAIMED)
        if task.state is State.DISPATCHING:
            failpoint("after:" + ev.EventType.DISPATCHING.value)


def _fenced(host: str, epoch: int, current: int | None) -> LeaseHeldError:
    if current is None:
        why = f"host {host} holds no lease"
    elif current == epoch:
        why = f"host {host}'s lease (epoch {epoch}) expired"
    else:
        why = f"host {host}'s lease is at epoch {current}, no longer at {epoch}"
    return LeaseHeldError(
        f"fenced: {why}",
        code="journal.fenced",
        details={"epoch": epoch, "current_epoch": current, "host": host},
    )


def _table(
    bodies: Mapping[str, Any],
    tombstones: Mapping[str, str] | None = None,
    settings: Mapping[str, Any] | None = None,
) -> Table:
    """The rows (and the keys whose task SUCCEEDED and was forgotten since), folded into
    a table the fold rules can check a batch against (``settings``: the groups', for a
    claim's rules)."""
    live: list[Any] = []
    settled: list[Any] = []
    for body in bodies.values():
        (settled if body["state"] in _TERMINAL else live).append(body)
    live.sort(key=lambda body: body.get("submit_seq", 0))  # (dependencies first)
    states = {body["id"]: body["state"] for body in settled}
    return Table.from_snapshot(
        {
            "format": SNAPSHOT_FORMAT,
            "last_seq": 0,
            "live": live,
            "settled": settled,
            "unsafe_keys": None,
            "succeeded_keys": dict(tombstones or {}),
            "queue": {**(settings or {}), "dependency_states": states},
        }
    )


def _json(data: Any) -> Any:
    from psycopg.types.json import Jsonb

    return Jsonb(data)


def _iso(value: datetime | None) -> str | None:
    """A database time as every time in ferry's JSON: RFC 3339, UTC, milliseconds."""
    return None if value is None else rfc3339(value.timestamp())


def _state_list(state: States) -> list[str]:
    """A state, or several (any of them), as the list ``state = ANY(%s)`` takes
    (``state = %s`` given a list compared each state with the array's text,
    ``'{FAILED,QUEUED}'``, and matched nothing)."""
    if state is None:
        return []
    return [state] if isinstance(state, str) else [str(s) for s in state]
