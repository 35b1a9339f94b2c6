"""The procrastinate app of pg_bench.py's baseline (not a benchmark module: no `_bench`).

Its one task runs the same subprocess as ferry's tasks, `true`, from a sync function
(procrastinate runs sync tasks in a thread of the worker). The worker processes find the
database in $PG_BENCH_PROCRASTINATE_URL (set by pg_bench.py); pg_bench.py itself makes
an app per database with `make_app`.
"""

from __future__ import annotations

import os
import subprocess

from procrastinate import App, PsycopgConnector

URL_ENV = "PG_BENCH_PROCRASTINATE_URL"


def run_true() -> None:
    subprocess.run(["true"], check=True)


def make_app(url: str) -> App:
    app = App(connector=PsycopgConnector(conninfo=url))
    app.task(name="run_true")(run_true)
    return app


app = make_app(os.environ.get(URL_ENV, ""))
