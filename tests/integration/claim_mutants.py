"""Each test of tests/integration/test_postgres_claim.py fails on a deliberately broken
``ferry_claim`` (schema migration 4): one mutation of the function per rule, the test
of that rule run against it (the file restored after). Not collected by pytest: run it
by hand after changing the function, from the repository, with the tests' Python:

    python tests/integration/claim_mutants.py [NAME ...]

Each line says FAILS (the test caught the mutation) or PASSES (bad: exit 1).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCHEMA = Path("ferry/storage/postgres/schema.py")
TESTS = "tests/integration/test_postgres_claim.py"


def mutated(original: str, old: str, new: str, count: int) -> str:
    """``original`` with ``old`` replaced in the claim's migration (``count`` times)."""
    start = original.index("CREATE FUNCTION ferry_claim")
    head, body = original[:start], original[start:]
    found = body.count(old)
    if found != count:
        raise SystemExit(f"{old!r}: found {found} times, not {count}")
    return head + body.replace(old, new)


# name -> (text replaced, replacement, times, the test that must fail)
MUTANTS: dict[str, tuple[str, str, int, str]] = {
    "priority ignored": (
        "ORDER BY q.priority DESC, q.queue_seq, q.id", "ORDER BY q.queue_seq, q.id", 2,
        "test_priority_first_then_queue_order",
    ),
    "not_before ignored": (
        "AND (q.not_before IS NULL OR q.not_before <= extract(epoch FROM now()))", "", 2,
        "test_a_task_is_not_claimed_before_its_not_before",
    ),
    "pause ignored": (
        "WHERE NOT coalesce(g.paused,", "WHERE true OR NOT coalesce(g.paused,", 1,
        "test_a_paused_group_is_not_claimed",
    ),
    "limit ignored": (
        "AND (coalesce(g.jobs, 0) <= 0 OR g.jobs >", "AND (true OR g.jobs >", 1,
        "test_a_group_limit_is_never_passed",
    ),
    "limit counted before the lock only": (
        "IF v_count >= v_group.jobs THEN", "IF false THEN", 1,
        "test_a_group_limit_holds_under_concurrent_claimers",
    ),
    "dependencies ignored": (
        "WHERE d.id IS NULL OR d.state <> 'SUCCEEDED')", "WHERE d.id IS NULL)", 2,
        "test_a_task_waits_until_every_dependency_succeeded",
    ),
    "missing dependency met": (
        "WHERE d.id IS NULL OR d.state <> 'SUCCEEDED')", "WHERE d.state <> 'SUCCEEDED')", 2,
        "test_a_missing_dependency_is_not_met",
    ),
    "epoch unchecked": (
        "IF v_epoch IS DISTINCT FROM p_epoch OR NOT coalesce(v_live, false) THEN",
        "IF NOT coalesce(v_live, false) THEN", 1,
        "test_a_stale_epoch_is_refused_with_nothing_written",
    ),
    "expiry unchecked": (
        "IF v_epoch IS DISTINCT FROM p_epoch OR NOT coalesce(v_live, false) THEN",
        "IF v_epoch IS DISTINCT FROM p_epoch THEN", 1,
        "test_an_expired_lease_is_refused_with_nothing_written",
    ),
    "no row lock": (
        "            FOR UPDATE OF q SKIP LOCKED;", "            ;", 1,
        "test_eight_claimers_claim_each_task_exactly_once",
    ),
    "reason kept": (
        "'cancel_requested', 'reason', 'exit_code',", "'cancel_requested', 'exit_code',", 1,
        "test_the_claim_writes_what_the_commit_path_writes",
    ),
    "attempt from nowhere": (
        "(t.body->>'attempt')::bigint AS attempt", "1::bigint AS attempt", 1,
        "test_a_retried_task_is_claimed_as_its_new_attempt",
    ),
}  # fmt: skip


def main(names: list[str]) -> int:
    original = SCHEMA.read_text()
    survived = 0
    try:
        for name, (old, new, count, test) in MUTANTS.items():
            if names and name not in names:
                continue
            SCHEMA.write_text(mutated(original, old, new, count))
            run = subprocess.run(
                [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                 f"{TESTS}::{test}"],
                capture_output=True, text=True, check=False,
            )  # fmt: skip
            why = [line.strip()[:160] for line in run.stdout.splitlines()
                   if line.startswith("E ")][:1]  # fmt: skip
            survived += run.returncode == 0
            verdict = "FAILS" if run.returncode else "PASSES (bad)"
            print(f"{verdict}: {name}: {test}: {' '.join(why)}", flush=True)
    finally:
        SCHEMA.write_text(original)
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
