"""What every command receives (:class:`Ctx`: the global options, the service), how
it reports along the way (:class:`CliReporter`), and ``run`` as both parsers call it.
Imports no click (``ferry.cli.fast`` uses it too)."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from ferry.app.runner import RunResult
    from ferry.app.service import Service
    from ferry.app.session import Session
    from ferry.app.tally import Progress
    from ferry.core.errors import FerryError
    from ferry.core.model import Task
    from ferry.core.recovery import RecoverReport


class Ctx:
    """What the global options say, handed to every command. ``runs_task`` is set by
    ``run`` and ``claim``: their failures before the task starts exit 125."""

    current: Ctx | None = None  # the invocation in progress, for main()'s error mapping

    def __init__(
        self,
        home: str | None,
        as_json: bool,
        verbosity: int,
        database: str | None = None,
        host: str | None = None,
    ) -> None:
        self.home = home
        self.as_json = as_json
        self.verbosity = verbosity
        self.database, self.host = database, host
        self.runs_task = False
        self.reporter = CliReporter(verbosity, as_json=as_json)
        self.session: Session | None = None
        Ctx.current = self

    def service(
        self, *, reading: bool = False, tolerant: bool = False, make: bool = True
    ) -> Service:
        """The use cases, over the state directory. ``reading``: the command only
        reads (it works on a directory ferry may not write, and writes nothing);
        ``tolerant``: it shows what it can of a damaged journal, and :meth:`damage`
        then says what is damaged (the command ends with it: exit 4); ``make=False``:
        it acts on tasks that exist, so a missing state directory is not made."""
        from ferry.app.service import Service  # lazy: keeps `ferry --help` cheap
        from ferry.app.session import Session

        self.session = Session.open(self.home, self.reporter, database=self.database,
                                    host=self.host, reading=reading,
                                    tolerate_damage=tolerant, make=make)  # fmt: skip
        return Service(self.session)

    def damage(self) -> FerryError | None:
        """What a command that shows what it can found damaged (one coded error)."""
        return None if self.session is None else self.session.damage()

    def ran(self, result: RunResult | None) -> int:
        """``run``/``claim``: under --json the task is the one document on stdout (the
        task's own stdout was echoed to stderr); the task's exit status passes through.
        None: ``claim`` found the queue empty. (``render`` only when something is said:
        a plain ``run`` that ends well prints nothing, and need not import it.)"""
        if result is None:
            from ferry.cli import render

            if self.as_json:
                self._task_document({"task": None})
            elif self.verbosity > 0:
                render.notice("the queue is empty")
            return 0
        if self.as_json:
            from ferry.cli import render

            self._task_document(render.task_json(result.task))
        return result.exit_status

    def _task_document(self, obj: Any) -> None:
        """The one document of ``run``/``claim --json``: the task ran whether or not
        stdout takes it (a full disk): its status passes through, a warning says it."""
        from ferry.cli import render

        try:
            render.write_json(obj)
        except render.OutputLost as lost:
            render.notice(f"warning: {lost.message}: the task's JSON document is lost")

    @property
    def stdout_echo_fd(self) -> int:
        """Under --json ferry's stdout carries one JSON document: the task's stdout is
        echoed to stderr instead (and kept byte-exact in its log as always)."""
        return 2 if self.as_json else 1


class CliReporter:
    """The notices of a use case still running, on stderr, as ``--quiet``/``-v`` ask;
    the tasks it settled, one line each on stderr (not under ``--quiet``), or, when
    ``json_lines`` (``work --json``), each one's task object on stdout; and a live
    progress line on stderr, redrawn in place, which every other line first clears."""

    def __init__(self, verbosity: int, *, as_json: bool = False) -> None:
        self.verbosity = verbosity
        self.as_json = as_json
        self.json_lines = False  # settled tasks as JSON Lines on stdout (work --json)
        self.lines_lost = False  # stdout could not take them (a full disk): said once
        self.live_line = ""  # the progress line drawn now ("": none)
        self.run_started = False  # run started its task (not skipped for its --key)

    def notice(self, message: str) -> None:
        if self.verbosity >= 0:
            from ferry.cli import render

            self._around_live_line(lambda: render.notice(message))

    def settled(self, task: Task) -> None:
        from ferry.cli import render

        if self.as_json:
            if self.json_lines and not self.lines_lost:
                try:
                    render.write_json(render.task_json(task))
                except render.OutputLost as lost:  # (work goes on: its tasks are its job)
                    self.lines_lost = True
                    self.notice(f"warning: {lost.message}: the settled tasks' JSON lines are lost")
        elif self.verbosity >= 0:
            self._around_live_line(lambda: render.stderr_line(render.settled_line(task)))

    def started(self, task: Task) -> None:
        self.run_started = True
        if self.verbosity > 0:
            from ferry.cli import render

            render.notice(render.run_started_text(task))

    def run_ended(self, result: RunResult) -> None:
        """``run``'s line about its task's end: when it did not succeed (not under
        --quiet), and with -v always (a task skipped for its --key: no line)."""
        from ferry.core.model import State

        failed = result.task.state is not State.SUCCEEDED
        if (
            self.verbosity < 0
            or result.skipped
            or not (failed or (self.verbosity > 0 and self.run_started))
        ):
            return
        from ferry.cli import render

        render.notice(render.run_ended_text(result.task, result.exit_status, self.verbosity > 0))

    def progress(self, progress: Progress) -> None:
        if self.verbosity >= 0:
            from ferry.cli import render

            text = render.progress_text(progress)
            if text != self.live_line:
                self.live_line = text
                render.redraw(text)

    def end_progress(self) -> None:
        """Clear the progress line for good (the command's own last words follow)."""
        if self.live_line:
            from ferry.cli import render

            render.redraw("")
            self.live_line = ""

    def _around_live_line(self, write: Callable[[], None]) -> None:
        if not self.live_line:
            write()
            return
        from ferry.cli import render

        render.redraw("")
        write()
        render.redraw(self.live_line)

    def detail(self, message: str) -> None:
        if self.verbosity > 0:
            self.notice(message)

    def recovered(self, report: RecoverReport) -> None:
        from ferry.cli import render

        for line in (render.recover_text(report, self.verbosity) or "").splitlines():
            self.notice(line)


def task_opts(kw: dict[str, Any], argv: tuple[str, ...]) -> dict[str, Any]:
    """The TASK OPTIONS (as the ``run``/``submit`` commands receive them) in the shape
    the service's build_spec takes."""
    return {
        "argv": list(argv),
        "name": kw["name"],
        "key": kw["key"],
        "idempotent": kw["idempotent"],
        "max_releases": kw["max_releases"],
        "timeout_s": kw["timeout"],
        "kill_grace_s": kw["kill_grace"],
        "heartbeat_s": kw["heartbeat"],
        "cwd": kw["cwd"],
        "env": list(kw["env"]),
        "pointers": list(kw["pointers"]),
        "patch_file": kw["patch_file"],
        "shell": kw["shell"],
        "pty": kw["pty"],
        "log_max": kw["log_max"],
        # submit's queue options (run has none: its task runs now)
        "group": kw.get("group"),
        "priority": kw.get("priority", 0),
        "after": list(kw.get("after") or ()),
        "not_before": kw.get("not_before"),
        "retries": kw.get("retries", 0),
        "retry_delay_s": kw.get("retry_delay", 1.0),
    }


def run_command(ctx: Ctx, kw: dict[str, Any], argv: tuple[str, ...]) -> int:
    """``ferry run``, however it was parsed (click or :mod:`ferry.cli.fast`)."""
    ctx.runs_task = True
    service = ctx.service()
    result = service.run(task_opts(kw, argv), stdout_echo_fd=ctx.stdout_echo_fd)
    ctx.reporter.run_ended(result)
    return ctx.ran(result)


def ended(ctx: Ctx | None, result: Any) -> int:
    """A command's exit status, once it returned ``result``. A reader that showed what
    it could of a damaged journal: now say what is not there, once, after its output,
    on stderr (under --json, stdout holds the one document it printed: what is
    readable), and exit 4."""
    damage = None if ctx is None else ctx.damage()
    if damage is not None:
        report(damage, False)
        return damage.exit_code
    return int(result or 0)


def report(error: FerryError, as_json: bool) -> None:
    from ferry.cli import render

    render.error(error, as_json=as_json)
