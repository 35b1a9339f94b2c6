"""Several processes appending to one journal at once (the cross-process append lock).

Each child appends its own records (singles and batches) with rotation on, and prints one
line per commit *after* append returned: that line is the child's claim "this was
committed". Afterwards the journal must verify, seqs must be gap-free, and every claimed
record must be there exactly once, with the seq the child was given.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import IO

import pytest

import journal

# argv: directory, proc id, appends, segment_bytes_max, go-file
CHILD = r"""
import os, sys, time
import journal
directory, proc, appends, seg_max, go = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
deadline = time.monotonic() + 30
while not os.path.exists(go):  # start together: more interleaving
    if time.monotonic() > deadline:
        sys.exit("go-file never appeared")
    time.sleep(0.001)
j = journal.Journal.open(directory, segment_bytes_max=seg_max)
i = 0
while appends < 0 or i < appends:
    if i % 4 == 3:
        recs = j.append_batch([("mp", {"p": proc, "i": i, "k": k}) for k in range(3)])
    else:
        recs = [j.append("mp", {"p": proc, "i": i, "k": 0})]
    for r in recs:
        sys.stdout.write(f"C {r.seq} {r.data['p']} {r.data['i']} {r.data['k']}\n")
    sys.stdout.flush()
    i += 1
j.close()
"""

Key = tuple[int, int, int]  # (proc, i, k)


def spawn(
    directory: Path, proc: int, appends: int, seg_max: int, go: Path
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-c",
            CHILD,
            str(directory),
            str(proc),
            str(appends),
            str(seg_max),
            str(go),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def parse_claims(text: str) -> dict[Key, int]:
    claims: dict[Key, int] = {}
    # Only whole lines: one cut by SIGKILL mid-print claims nothing (it may end in a
    # digit: "C 1186 12 63", whose k, or i, is cut short).
    for line in text.split("\n")[:-1]:
        _, seq, p, i, k = line.split()
        claims[(int(p), int(i), int(k))] = int(seq)
    return claims


def records_by_key(directory: Path) -> tuple[list[int], list[Key]]:
    j = journal.Journal.open(directory)
    try:
        records = list(j.read())
    finally:
        j.close()
    return [r.seq for r in records], [(r.data["p"], r.data["i"], r.data["k"]) for r in records]


def reap(procs: list[subprocess.Popen[str]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=30)


def assert_clean(directory: Path) -> None:
    report = journal.verify(directory)
    assert report.clean, report


@pytest.mark.timeout(180)
@pytest.mark.parametrize("procs", [6])
def test_concurrent_appenders_leave_every_committed_record_once(tmp_path: Path, procs: int) -> None:
    directory, go = tmp_path / "j", tmp_path / "go"
    appends = 40
    children = [spawn(directory, p, appends, 2048, go) for p in range(procs)]
    try:
        go.touch()
        outputs = [c.communicate(timeout=150) for c in children]
    finally:
        reap(children)
    for child, (_, err) in zip(children, outputs, strict=True):
        assert child.returncode == 0, err
    claims: dict[Key, int] = {}
    for out, _ in outputs:
        claims.update(parse_claims(out))
    per_proc = appends + (appends // 4) * 2  # every 4th append is a batch of 3
    assert len(claims) == procs * per_proc

    assert_clean(directory)
    seqs, keys = records_by_key(directory)
    assert seqs == list(range(1, len(seqs) + 1)), "seqs are gap-free from 1"
    assert len(keys) == len(set(keys)), [k for k, n in Counter(keys).items() if n > 1]
    found = dict(zip(keys, seqs, strict=True))
    for key, seq in claims.items():
        assert found.get(key) == seq, (key, seq, found.get(key))
    assert set(found) == set(claims), "no record nobody appended"
    segments = sorted(directory.glob("*.jsonl"))
    assert len(segments) > 3, "rotation happened while processes raced"
    # Each process's records are in its own order, batches contiguous.
    for p in range(procs):
        mine = [key for key in keys if key[0] == p]
        assert mine == sorted(mine)
    for idx, key in enumerate(keys):
        if key[2] > 0:
            assert keys[idx - 1] == (key[0], key[1], key[2] - 1), "a batch was split"


def read_claims_until(stream: IO[str], count: int, deadline_s: float) -> list[str]:
    lines: list[str] = []
    deadline = time.monotonic() + deadline_s
    while len(lines) < count:
        assert time.monotonic() < deadline, "child made no progress"
        line = stream.readline()
        assert line, "child exited early"
        lines.append(line)
    return lines


@pytest.mark.timeout(180)
def test_sigkill_of_one_appender_leaves_a_valid_or_repairable_journal(tmp_path: Path) -> None:
    directory, go = tmp_path / "j", tmp_path / "go"
    survivor = spawn(directory, 0, 150, 4096, go)
    victim = spawn(directory, 1, -1, 4096, go)  # appends until killed
    try:
        go.touch()
        assert victim.stdout is not None
        seen = read_claims_until(victim.stdout, 30, 60)
        victim.send_signal(signal.SIGKILL)
        rest, _ = victim.communicate(timeout=30)
        assert victim.returncode == -signal.SIGKILL
        out, err = survivor.communicate(timeout=150)
        assert survivor.returncode == 0, err
    finally:
        reap([survivor, victim])

    claims = parse_claims("".join(seen) + rest) | parse_claims(out)
    report = journal.verify(directory)
    if not report.clean:
        assert report.torn_tail is not None, report  # a torn tail is fine; corruption is not
        journal.repair(directory)
        assert_clean(directory)
    seqs, keys = records_by_key(directory)
    assert seqs == list(range(1, len(seqs) + 1))
    assert len(keys) == len(set(keys))
    found = dict(zip(keys, seqs, strict=True))
    for key, seq in claims.items():
        assert found.get(key) == seq, (key, seq)
    # The survivor's later appends were not blocked by the dead process's lock.
    assert sum(1 for key in found if key[0] == 0) == 150 + (150 // 4) * 2


@pytest.mark.soak
@pytest.mark.timeout(900)
@pytest.mark.parametrize("seed", range(10))
def test_repeated_sigkills_during_frequent_rotation(tmp_path: Path, seed: int) -> None:
    """Three survivors and three victims; each victim is killed after a random number of
    its commits, with segments so small that kills often land near a rotation."""
    rng = random.Random(seed)
    directory, go = tmp_path / "j", tmp_path / "go"
    survivors = [spawn(directory, p, 60, 600, go) for p in range(3)]
    victims = [spawn(directory, 10 + p, -1, 600, go) for p in range(3)]
    claims: dict[Key, int] = {}
    try:
        go.touch()
        for victim in victims:
            assert victim.stdout is not None
            seen = read_claims_until(victim.stdout, rng.randint(1, 40), 60)
            victim.send_signal(signal.SIGKILL)
            rest, _ = victim.communicate(timeout=30)
            claims |= parse_claims("".join(seen) + rest)
        for survivor in survivors:
            out, err = survivor.communicate(timeout=300)
            assert survivor.returncode == 0, err
            claims |= parse_claims(out)
    finally:
        reap(survivors + victims)
    report = journal.verify(directory)
    if not report.clean:
        assert report.torn_tail is not None, report
        journal.repair(directory)
        assert_clean(directory)
    seqs, keys = records_by_key(directory)
    assert seqs == list(range(1, len(seqs) + 1))
    assert len(keys) == len(set(keys))
    found = dict(zip(keys, seqs, strict=True))
    for key, seq in claims.items():
        assert found.get(key) == seq, (key, seq)
