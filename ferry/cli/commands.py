"""The ferry commands. Each one parses, calls one service method, renders.

Kept apart from ``ferry.cli.tree`` (the group and global options) and ``ferry.cli`` (the
entry point and error mapping) so that each file stays small.  Every help text ends with an
example.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import click
from click.core import ParameterSource

from ferry.cli import many, plain
from ferry.cli.context import run_command, task_opts
from ferry.core.errors import EX_TIMEOUT, LeaseHeldError, UsageError

Emit = Callable[[Any, str | None, Any], None]


class Seconds(click.FloatRange):
    """click's FloatRange without NaN, which passes every range check (each comparison
    with it is false) and would reach a lease, a poll or a wait as a number."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        result = super().convert(value, param, ctx)
        if math.isnan(result):
            self.fail(f"{value!r} is not a number of seconds.", param, ctx)
        return result


_STATES = [
    "QUEUED",
    "CLAIMED",
    "DISPATCHING",
    "RUNNING",
    "STALE",
    "SUCCEEDED",
    "FAILED",
    "CANCELLED",
]


# The leader commands' shared option (claim, work, recover).
_LEASE_TTL = click.option(
    "--lease-ttl",
    type=Seconds(0.1, 86400),
    default=30.0,
    show_default=True,
    help="Seconds a silent leader keeps the lease before another may take it. On a shared"
    " database, also how long a task of claim or work may go unheard before it is stopped;"
    " recover waits twice that (or twice the task's own) before deciding another host's.",
)
_KILL_STALE = click.option(
    "--kill-stale",
    is_flag=True,
    help="Also kill the processes of a task marked STALE (its runner lives but is silent).",
)


_STATE_SELECTOR = click.option(
    "--state",
    type=click.Choice(_STATES, case_sensitive=False),
    help="Every task now in this state, instead of ids.",
)


def _listed(state: str | None) -> Any:
    """The state ``--state`` selected tasks by (None: ids were given): each is acted on
    only if it is still in it when decided (``task.moved``)."""
    from ferry.core.model import State

    return None if state is None else State(state.upper())


def _each_quietly(ctx: Any, ids: Sequence[str], action: many.Action) -> int:
    """``many.for_each`` for a command whose output is its own (``logs``): nothing
    printed per task but errors; the first failure's exit code, or 0."""
    as_json, ctx.as_json = ctx.as_json, False
    try:
        return many.for_each(ctx, ids, action, many=True)
    finally:
        ctx.as_json = as_json


def _example(text: str) -> str:
    return "Example:\n\n\b\n" + "\n".join("  " + line for line in text.strip().splitlines())


def register(
    cli: click.Group,
    task_options: Callable[[Any], Any],
    emit: Emit,
    queue_options: Callable[[Any], Any],
) -> None:
    """Attach every command to the ``cli`` group."""
    from ferry.cli import render
    from ferry.cli.queue_commands import register_queue

    register_queue(cli, emit)

    @cli.command(
        context_settings={"allow_interspersed_args": False},
        epilog=_example(
            "ferry run --key build-$SHA --timeout 3600 -- make test\n"
            "ferry run --pty -- pytest -q   # the task sees a terminal: colours kept\n"
            "ferry -v run -- make lint      # also a line as it starts and as it ends"
        ),
    )
    @task_options
    @click.argument("argv", nargs=-1, required=True, metavar="-- CMD [ARG...]")
    @click.pass_obj
    def run(ctx: Any, /, argv: tuple[str, ...], **kw: Any) -> int:
        """Run CMD now, in the foreground, as a journaled task.

        Output streams live and is kept in full; SIGINT/SIGTERM/SIGHUP reach the task's
        whole process group; the task's exit status passes through (124 timeout, 125
        ferry failed before the task started, 126/127 not executable/not found,
        128+N killed by signal N). A task that did not succeed gets one line on stderr:
        ferry: task #N ID failed: REASON (exit STATUS).
        """
        return run_command(ctx, kw, argv)

    @cli.command(
        context_settings={"allow_interspersed_args": False},
        epilog=_example(
            "ferry submit --idempotent --name nightly -- ./nightly.sh\n"
            'printf \'%s\\n\' \'{"argv": ["make", "docs"]}\' | ferry submit --from -\n'
            "seq 1 100 | sed 's/.*/.\\/process.sh &/' | ferry submit --idempotent --lines -\n"
            "ferry submit --group arm64 --priority 5 --retries 2 --after 12 -- make dist"
        ),
    )
    @task_options
    @queue_options
    @click.option(
        "--from",
        "from_file",
        type=click.File("rb"),
        help="Queue many tasks, one JSON object of task options per line (- for stdin), in"
        " one write; a bad line queues none.",
    )
    @click.option(
        "--lines",
        "lines_file",
        type=click.File("rb"),
        help="Queue one task per non-empty line (- for stdin), each line a shell command run"
        " by /bin/sh, with this command's TASK OPTIONS, in one write.",
    )
    @click.argument("argv", nargs=-1, metavar="-- CMD [ARG...]")
    @click.pass_obj
    def submit(
        ctx: Any, /, argv: tuple[str, ...], from_file: Any, lines_file: Any, **kw: Any
    ) -> None:
        """Queue a task (or many with --from or --lines) and print its id.

        In a --from line, "after" may also name a task of the same file by its line
        ("line:3"); the lines are queued dependencies first, and a cycle is refused.
        """
        if lines_file is None and from_file is None:
            if not argv:
                raise UsageError(
                    "missing CMD: ferry submit [OPTIONS] -- CMD [ARG...]"
                    " (see 'ferry submit --help')",
                    code="usage.missing_command",
                )
            return plain.submit(ctx, kw, argv)
        from ferry.app.intake import read_batch

        svc = ctx.service()
        if lines_file is not None:
            if argv or from_file is not None:
                raise click.UsageError("give one of CMD, --from and --lines")
            data = read_batch(lines_file, "--lines", lines_file.name)
            tasks = svc.submit_lines(data, source=lines_file.name, opts=task_opts(kw, ()))
        else:
            if argv:
                raise click.UsageError("give either CMD or --from, not both")
            click_ctx = click.get_current_context()
            given = [
                param.opts[0]
                for param in click_ctx.command.params
                if param.name in kw
                and click_ctx.get_parameter_source(param.name) is ParameterSource.COMMANDLINE
            ]
            if given:
                raise click.UsageError(
                    f"with --from, each line carries its task's options: {', '.join(given)}"
                    " would be ignored"
                )
            data = read_batch(from_file, "--from", from_file.name)
            tasks = svc.submit_many(data, source=from_file.name)
        plain.submitted(ctx, tasks, many=True)

    @cli.command(
        epilog=_example(
            'ferry claim || echo "task failed with $?"\n'
            "while ferry claim --empty-exit 100; [ $? -ne 100 ]; do :; done  # one at a time"
        )
    )
    @_LEASE_TTL
    @click.option(
        "--empty-exit",
        type=click.IntRange(0, 255),
        default=0,
        show_default=True,
        metavar="N",
        help="Exit N when the queue is empty (as flock -E), so that a loop of claims ends.",
    )
    @click.pass_obj
    def claim(ctx: Any, lease_ttl: float, empty_exit: int) -> int:
        """Become leader briefly, recover, then run the oldest queued task in the foreground.

        Empty queue: exit 0, or --empty-exit's N (--json: {"task": null}).
        """
        ctx.runs_task = True
        result = ctx.service().claim(lease_ttl_s=lease_ttl, stdout_echo_fd=ctx.stdout_echo_fd)
        if result is not None:  # (as run: a line when its task did not succeed)
            ctx.reporter.run_ended(result)
        status = int(ctx.ran(result))
        return empty_exit if result is None else status

    @cli.command(
        epilog=_example(
            "ferry work -j 4 --drain --halt soon || echo 'a task did not succeed'\n"
            "ferry --json work --drain | jq -r 'select(.state != \"SUCCEEDED\") | .id'"
        )
    )
    @click.option(
        "-j",
        "--jobs",
        type=click.IntRange(1, 256),
        default=1,
        show_default=True,
        help="How many tasks run at once.",
    )
    @click.option(
        "--drain",
        is_flag=True,
        help="Exit once the queue is empty and nothing runs: 0 if every task this worker"
        " settled SUCCEEDED, else 1; stopped by a signal first, 128 + it (130: Ctrl-C).",
    )
    @click.option(
        "--halt",
        type=click.Choice(["soon", "now"]),
        help="After the first task that FAILED, claim no more and exit 1: soon lets the"
        " running tasks end; now also stops them (SIGTERM, SIGKILL after their"
        " --kill-grace; they settle CANCELLED).",
    )
    @click.option(
        "--poll",
        type=Seconds(0.01, 3600),
        default=1.0,
        show_default=True,
        help="Seconds between looks at the queue (and at the lease, as a standby).",
    )
    @_LEASE_TTL
    @click.option(
        "--stale-after",
        type=Seconds(0.1, 10**9),
        default=None,
        help="Mark other runners STALE after this many silent seconds (default: 3 heartbeats).",
    )
    @_KILL_STALE
    @click.pass_obj
    def work(
        ctx: Any,
        jobs: int,
        drain: bool,
        halt: str | None,
        poll: float,
        lease_ttl: float,
        stale_after: float | None,
        kill_stale: bool,
    ) -> int:
        """The leader loop: lead (or wait as standby), recover, run queued tasks, N at a time.

        Each task it settles is one line on stderr (id, state, exit status or signal,
        duration, name); with --json, its task object on stdout (JSON Lines) instead.
        With --drain on a terminal, a live progress line too. At the end, a summary
        line: N succeeded, M failed, K cancelled in T s. -q: none of them.

        SIGTERM: stop claiming, let running tasks finish, release the lease. A second
        signal stops the running tasks at once (SIGTERM, SIGKILL after their --kill-grace).
        """
        return plain.work(ctx, jobs, drain, halt, poll, lease_ttl, stale_after, kill_stale)

    @cli.command(
        epilog=_example(
            "ferry wait $(ferry submit -- make test) && echo passed\n"
            "ferry wait --timeout 3600   # every task not yet settled"
        )
    )
    @click.argument("task_ids", nargs=-1, metavar="[ID]...")
    @click.option(
        "--timeout",
        type=Seconds(0, 10**9),
        help="Give up after this many seconds: exit 124.",
    )
    @click.pass_obj
    def wait(ctx: Any, task_ids: tuple[str, ...], timeout: float | None) -> int:
        """Wait until tasks settle: exit 0 if all SUCCEEDED, 1 if not, 124 on --timeout.

        No ID: every task not settled when it starts. Each task is one line on stderr as
        it settles, then a summary; with --json, the tasks' objects as one array on stdout
        at the end (on a timeout too, as they are then).
        """
        report = ctx.service(reading=True).wait(list(task_ids), timeout_s=timeout)
        if ctx.as_json:
            render.write_json([render.task_json(task) for task in report.tasks])
        if report.timed_out:
            count, total = len(report.unsettled), len(report.tasks)
            tasks = "task" if total == 1 else "tasks"
            ctx.reporter.notice(f"{count} of {total} {tasks} not settled after {timeout or 0:g} s")
            return EX_TIMEOUT
        if ctx.verbosity >= 0:
            render.stderr_line(render.summary(report))
        return 0 if report.all_succeeded else 1

    @cli.command(epilog=_example("* * * * * ferry recover   # crontab: silent unless it acts"))
    @click.option("--dry-run", is_flag=True, help="Decide and print, journal nothing.")
    @click.option(
        "--stale-after",
        type=Seconds(0.1, 10**9),
        default=None,
        help="A live runner silent this long is STALE (default: 3 of its heartbeats).",
    )
    @_KILL_STALE
    @_LEASE_TTL
    @click.pass_obj
    def recover(
        ctx: Any, dry_run: bool, stale_after: float | None, kill_stale: bool, lease_ttl: float
    ) -> int:
        """Decide every unfinished task after a crash; exit 3 if an operator is needed.

        Takes the lease (exit 75 if a live leader holds it), replays the journal, decides
        each task whose runner is gone (quarantine, fail, requeue), journals the decisions.
        """
        try:
            report = ctx.service(make=False).recover(
                dry_run=dry_run,
                stale_after_s=stale_after,
                kill_stale=kill_stale,
                lease_ttl_s=lease_ttl,
            )
        except LeaseHeldError as error:
            # A live leader is responsible: nothing for us to do, nothing to say (cron
            # mails whatever it prints, every minute). -v or --json still say it, and
            # so does a leader of another boot (another machine with this host id?).
            loud = ctx.as_json or ctx.verbosity > 0 or error.details.get("another_boot")
            if error.code != "lease.held" or loud:
                raise
            return error.exit_code
        emit(ctx, render.recover_text(report, ctx.verbosity), render.recover_json(report))
        return int(report.exit_code)

    @cli.command(name="ls", epilog=_example("ferry ls --state FAILED --limit 20"))
    @click.option(
        "--state",
        type=click.Choice(_STATES, case_sensitive=False),
        multiple=True,
        help="Only tasks in this state (repeatable: any of them).",
    )
    @click.option("--limit", type=click.IntRange(0), default=100, show_default=True, help="0: all.")
    @click.pass_obj
    def ls_(ctx: Any, state: tuple[str, ...], limit: int) -> None:
        """List tasks in submission order, the last submitted last.

        When rows are left out (--limit), a line on stderr says how many are shown.
        """
        plain.ls(ctx, state, limit)

    @cli.command(
        epilog=_example(
            "ferry show 01jq3   # any unique prefix of the id\n"
            "ferry show 12 13 last   # task numbers, and the latest submitted"
        )
    )
    @click.argument("task_ids", nargs=-1, required=True, metavar="ID...")
    @click.option("--show-env", is_flag=True, help="Also print --env values (secrets!).")
    @click.pass_obj
    def show(ctx: Any, task_ids: tuple[str, ...], show_env: bool) -> int:
        """Show tasks, all of each, including the recovery evidence.

        Several ids: one block each, a blank line between (--json: an array)."""

        return plain.show(ctx, task_ids, show_env)

    @cli.command(
        epilog=_example(
            "ferry logs 01jq3 --stream stderr --tail 50 -f\n"
            "ferry logs last --merged | less   # stdout and stderr as they were written\n"
            "ferry logs -f 12 && echo 'task 12 succeeded'"
        )
    )
    @click.argument("task_ids", nargs=-1, required=True, metavar="ID...")
    @click.option(
        "--stream",
        type=click.Choice(["stdout", "stderr"]),
        help="Only this stream, to ferry's stdout (default: both, each to its own).",
    )
    @click.option(
        "--merged",
        is_flag=True,
        help="Both streams to ferry's stdout, in the order the task wrote them.",
    )
    @click.option("--tail", type=click.IntRange(0), help="Only the last N lines (of each stream).")
    @click.option(
        "-f",
        "--follow",
        is_flag=True,
        help="Keep printing until the task settles (through its retries, without"
        " --attempt); then exit 0 if it SUCCEEDED, else 1.",
    )
    @click.option("--attempt", type=click.IntRange(1), help="Which attempt (default: latest).")
    @click.pass_obj
    def logs(
        ctx: Any,
        task_ids: tuple[str, ...],
        stream: str | None,
        merged: bool,
        tail: int | None,
        follow: bool,
        attempt: int | None,
    ) -> int:
        """Print a task's captured output, complete and byte-exact, in the order it was written.

        Without --stream the task's stdout goes to stdout and its stderr to stderr,
        replayed in the order the task wrote them (--merged: both to stdout). Ctrl-C
        while following exits 130, quietly. Several ids: one after the other, each
        after a line '==> #N ID <==' on stdout (-f follows each to its end in turn; JSON
        lines name their task).
        """
        if merged and stream is not None:
            raise click.UsageError("give either --merged or --stream, not both")
        succeeded, as_json = [], ctx.as_json
        service = ctx.service(reading=True, tolerant=True)

        def one(task_id: str) -> tuple[str | None, Any]:
            if len(task_ids) > 1 and not as_json:
                task = service.show(task_id)
                render.emit(as_json=False, human=f"==> #{task.number} {task.id} <==", payload=None)
            succeeded.append(service.logs(
                task_id, stream=stream, tail=tail, follow=follow, attempt=attempt,
                as_json=as_json, merged=merged,
            ))  # fmt: skip
            return None, None

        try:
            if len(task_ids) == 1:
                one(task_ids[0])
                failed = 0
            else:
                failed = _each_quietly(ctx, task_ids, one)
        except KeyboardInterrupt:
            if not follow:
                raise
            return 130  # the user stopped following: nothing went wrong, nothing to say
        return failed or (0 if all(succeeded) or not follow else 1)

    @cli.command(
        epilog=_example("ferry --json lease\nferry lease --reset   # after error[lease.unreadable]")
    )
    @click.option(
        "--reset",
        is_flag=True,
        help="Operator action for an unreadable lease.json: move it aside and write a "
        "released lease at the journal's highest epoch (a readable lease is left alone).",
    )
    @click.pass_obj
    def lease(ctx: Any, reset: bool) -> None:
        """Show who leads: holder, epoch, since, expires."""
        svc = ctx.service(reading=not reset, tolerant=not reset)
        if reset:
            moved = svc.lease_reset()
            text = f"moved the unreadable lease to {moved}" if moved else "the lease reads fine"
            emit(ctx, text, {"reset": moved is not None, "moved_to": moved})
            return
        info = svc.lease_info()
        from ferry.core.model import times_as_rfc3339

        emit(ctx, render.lease_text(info), times_as_rfc3339(info))

    @cli.command(
        epilog=_example(
            "ferry cancel 01jq3\nferry cancel 12 13 14\nferry cancel --state QUEUED   # empty the queue"
        )
    )
    @click.argument("task_ids", nargs=-1, metavar="[ID]...")
    @_STATE_SELECTOR
    @click.pass_obj
    def cancel(ctx: Any, task_ids: tuple[str, ...], state: str | None) -> int:
        """Cancel queued tasks, or signal running ones' process groups and cancel them.

        Each task on its own: one that cannot be cancelled is reported and the others
        go on (exit: that one's code)."""

        service = many.OneService(ctx)

        def one(task_id: str) -> tuple[str | None, Any]:
            task = service().cancel(task_id, listed=_listed(state))
            return f"{task.id} {task.state}", render.task_json(task)

        ids = many.targets(ctx, task_ids, state, service)
        return many.for_each(ctx, ids, one, many=state is not None, service=service)

    @cli.command(
        epilog=_example("ferry retry 01jq3\nferry retry --state FAILED   # every failed task again")
    )
    @click.argument("task_ids", nargs=-1, metavar="[ID]...")
    @_STATE_SELECTOR
    @click.option("--force", is_flag=True, help="Even while a quarantined orphan is alive.")
    @click.pass_obj
    def retry(ctx: Any, task_ids: tuple[str, ...], state: str | None, force: bool) -> int:
        """Queue FAILED or CANCELLED tasks again, each as a new attempt (same id)."""

        service = many.OneService(ctx)

        def one(task_id: str) -> tuple[str | None, Any]:
            task = service().retry(task_id, force=force, listed=_listed(state))
            return f"{task.id} attempt {task.attempt} QUEUED", render.task_json(task)

        ids = many.targets(ctx, task_ids, state, service)
        return many.for_each(ctx, ids, one, many=state is not None, service=service)

    @cli.command(epilog=_example("ferry resolve 01jq3 --as succeeded   # I checked: it deployed"))
    @click.argument("task_id", metavar="ID")
    @click.option(
        "--as",
        "verdict",
        required=True,
        type=click.Choice(["succeeded", "failed"]),
        help="What the task really did, as far as you know.",
    )
    @click.option("--force", is_flag=True, help="Even while a quarantined orphan is alive.")
    @click.pass_obj
    def resolve(ctx: Any, task_id: str, verdict: str, force: bool) -> None:
        """Record your verdict on a FAILED or CANCELLED task (journaled, in its evidence).

        A --key whose latest task ended unsafe (MARKED_FAILED_MUTATION_UNSAFE,
        QUARANTINED_ORPHAN_ALIVE) is not run again until you retry or resolve that task;
        resolved as succeeded, the key is skipped like any succeeded key; as failed, the
        key runs again."""
        task = ctx.service(make=False).resolve(task_id, verdict=verdict, force=force)
        emit(ctx, f"{task.id} resolved as {verdict}", render.task_json(task))

    @cli.command(epilog=_example("ferry kill 01jq3 --signal KILL\nferry kill 12 13"))
    @click.argument("task_ids", nargs=-1, required=True, metavar="ID...")
    @click.option(
        "--signal",
        "signame",
        default="TERM",
        show_default=True,
        help="A signal name (TERM, SIGKILL, hup) or number.",
    )
    @click.pass_obj
    def kill(ctx: Any, task_ids: tuple[str, ...], signame: str) -> int:
        """Signal quarantined orphans' process groups, after proving each is the same process.

        SIGCONT follows (as for a forwarded signal): a stopped orphan gets it too.
        """

        service = many.OneService(ctx)

        def one(task_id: str) -> tuple[str | None, Any]:
            result = service().kill(task_id, signame)
            return result.get("message"), result

        return many.for_each(ctx, task_ids, one, many=False, service=service)

    @cli.group(epilog=_example("ferry journal verify && ferry journal compact"))
    def journal() -> None:
        """Inspect and maintain the journal."""

    @journal.command(epilog=_example("ferry journal verify || alert 'journal corrupt'"))
    @click.pass_obj
    def verify(ctx: Any) -> int:
        """Check every record: exit 0 clean (a torn tail is reported, untouched), 4 corrupt.

        Also names the records every command skips (a sound line whose event is illegal).
        """
        report = ctx.service(reading=True).journal_verify()
        emit(ctx, render.verify_text(report), render.verify_json(report))
        if report.get("error"):  # corrupt: also the one coded error line on stderr
            from ferry.core.errors import FerryError

            error = report["error"]
            render.error(FerryError(error["message"], code=error["code"]), as_json=False)
        return int(report.get("exit_code", 0))

    @journal.command(epilog=_example("ferry journal repair"))
    @click.pass_obj
    def repair(ctx: Any) -> None:
        """Cut a torn tail (keeping a .broken copy); refuse to touch corruption elsewhere."""
        report = ctx.service(make=False).journal_repair()
        emit(ctx, render.repair_text(report), report)

    @journal.command(
        epilog=_example(
            "ferry journal compact\nferry journal compact --no-wait   # from cron, beside a work service"
        )
    )
    @click.option(
        "--no-wait",
        is_flag=True,
        help="If another compaction is running, do nothing (it does the work): exit 0 and"
        " say so, instead of waiting for it.",
    )
    @click.pass_obj
    def compact(ctx: Any, no_wait: bool) -> None:
        """Write a snapshot and drop the segments it covers; merge the archives of
        settled tasks that are due (by size tiers; all of them after a gc)."""
        report = ctx.service(make=False).journal_compact(wait=not no_wait)
        emit(ctx, render.compact_text(report), report)

    @journal.command(
        epilog=_example(
            "ferry journal verify || ferry journal salvage --dry-run   # what would be lost\n"
            "ferry journal salvage   # keep the damaged journal aside, carry on from the rest"
        )
    )
    @click.option(
        "--dry-run", is_flag=True, help="Say what it would keep and lose; change nothing."
    )
    @click.pass_obj
    def salvage(ctx: Any, dry_run: bool) -> None:
        """Operator action for a damaged journal (exit 4, journal.corrupt): move it aside.

        The damaged journal is moved whole to journal.damaged-<time>/ (never deleted)
        and a new one is written from every record before the damage (its newest usable
        snapshot, then the records after it). Prints what was lost: the records after
        the damage, and each task whose state is now older, or gone. Refuses a journal
        that is only torn at its end ('ferry journal repair' cuts that) or not damaged.
        """
        report = ctx.service(make=False).journal_salvage(dry_run=dry_run)
        emit(ctx, render.salvage_text(report), report)

    @journal.command(epilog=_example("ferry journal dump --from 1200 | jq .type"))
    @click.option(
        "--from",
        "from_seq",
        type=click.IntRange(1),
        default=1,
        show_default=True,
        help="Start at this seq (records compacted away are not shown).",
    )
    @click.pass_obj
    def dump(ctx: Any, from_seq: int) -> None:
        """Print every record as JSON Lines."""
        ctx.service(reading=True).journal_dump(from_seq=from_seq)

    @cli.group(epilog=_example("ferry --database postgresql://ferry@db/ferry db init"))
    def db() -> None:
        """Set up and inspect a shared PostgreSQL database (--database URL)."""

    @db.command(name="init", epilog=_example('ferry --database "$FERRY_DATABASE_URL" db init'))
    @click.pass_obj
    def db_init(ctx: Any) -> None:
        """Create or upgrade ferry's schema (idempotent; refuses a database that is not durable)."""
        report = ctx.service().db_init()
        before, after = report["previous_version"], report["schema_version"]
        news = "created" if before == 0 else "up to date" if before == after else f"was {before}"
        human = f"ferry schema version {after} ({news})"
        emit(ctx, human, report)

    @db.command(name="status", epilog=_example('ferry --database "$FERRY_DATABASE_URL" db status'))
    @click.pass_obj
    def db_status(ctx: Any) -> None:
        """The schema version, the tasks by state, the hosts and their leases."""
        report = ctx.service().db_status()
        emit(ctx, render.db_status_text(report), report)
