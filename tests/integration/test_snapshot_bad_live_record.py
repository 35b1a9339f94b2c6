"""A snapshot whose one live (QUEUED) record has a field that cannot be decoded (its
checksums made good again: written so by a bug, or by another tool) is refused when it
is read, by every command, with ``journal.snapshot_mismatch``: never an internal error,
never a usage error, and never after a command already acted on it. Since a snapshot's
records are decoded when first asked for (``ferry.core.live``), each is checked when
read for what decoding needs (``check_record``). (From an adversarial review.)"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from clikit import Ferry
from hardkit import cli_in, make_template


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_template(tmp_path_factory)


@pytest.fixture
def cli(tmp_path: Path, template: Path) -> Iterator[Ferry]:
    with cli_in(tmp_path, template) as driver:
        yield driver


def _edit_live_record(cli: Ferry, edit) -> str:
    cli.ok("journal", "compact")
    (path,) = (cli.home / "journal").glob("snapshot-*.snap")
    head, _, body = path.read_bytes().partition(b"\n")
    data = json.loads(body)
    (record,) = data["live"]
    edit(record)
    body = json.dumps(data).encode()
    header = head[: head.rindex(b',"crc":"')]
    header = header[: header.rindex(b',"length"')]
    header += b',"length":%d,"data_crc":"%08x"' % (len(body), zlib.crc32(body))
    path.write_bytes(header + b',"crc":"%08x"}\n' % zlib.crc32(header) + body)
    path.chmod(0o600)
    return record["id"]


EDITS = {
    "bad_reason": lambda r: r.update(reason="no-such-reason"),
    "runner_not_object": lambda r: r.update(runner=7),
}
COMMANDS = [
    ("ls",),
    ("show", "{id}"),
    ("cancel", "{id}"),
    ("submit", "--", "true"),
    ("run", "--", "true"),
    ("claim",),
    ("journal", "compact"),
    ("gc",),
]


@pytest.mark.parametrize("edit", sorted(EDITS))
@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: "-".join(a).replace("{id}", "ID"))
def test_a_bad_live_record_is_a_mismatch_for_every_command(
    cli: Ferry, edit: str, args: tuple[str, ...]
) -> None:
    task_id = _edit_live_record(cli, EDITS[edit])
    argv = [a.replace("{id}", task_id) for a in args]
    result = cli(*argv)
    assert result.error_code() == "journal.snapshot_mismatch", (result.code, result.err)
    assert result.code in (4, 125)


def test_a_live_record_whose_spec_lacks_argv_is_not_a_usage_error(cli: Ferry) -> None:
    """(Before, TaskSpec.from_json's UsageError blamed the damage on the command line.)"""
    _edit_live_record(cli, lambda r: r["spec"].pop("argv"))
    result = cli("ls")
    assert result.error_code() == "journal.snapshot_mismatch", (result.code, result.err)


def test_a_run_whose_compaction_meets_the_bad_record_is_not_an_internal_error(cli: Ferry) -> None:
    """Were submit and run let write on top of the bad snapshot, ``run`` (which
    compacts after its task settled, once one is due) would meet the record in its
    snapshot's live tasks: its task run and succeeded, and ferry saying
    error[internal], exit 125."""
    _edit_live_record(cli, EDITS["bad_reason"])
    lines = b"".join(b'{"argv": ["true"], "name": "t%d"}\n' % i for i in range(260))
    cli("submit", "--from", "-", stdin=lines)  # (refused: the snapshot is read first)
    result = cli("run", "--name", "after", "--", "true")
    assert result.error_code() in (None, "journal.snapshot_mismatch"), result.err
