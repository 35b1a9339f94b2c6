"""The three patch gates, each on its own, with the attack texts that motivated them."""

from __future__ import annotations

import hashlib

import orjson
import pytest

from ferry.core.errors import EX_FERRY_FAILED, EX_USAGE, PatchGateError, exit_code_for
from ferry.core.model import Reason
from ferry.core.patch import (
    EMPTY_PATCH_HUNKS,
    GATE_REASONS,
    NOT_A_UNIFIED_DIFF,
    PATCH_DOES_NOT_COVER_POINTERS,
    check_gates,
    normalise_path,
    parse_patch,
)

# The original hole: any text unlocked a review of a file the worker never saw.
PROSE_49 = b"I reviewed calc.ts and it looks fine to me, ship."
README_ONLY = (
    b"diff --git a/README.md b/README.md\n"
    b"index 3b18e51..a042389 100644\n"
    b"--- a/README.md\n"
    b"+++ b/README.md\n"
    b"@@ -1,2 +1,2 @@\n"
    b" # calc\n"
    b"-A calculator.\n"
    b"+A small calculator.\n"
)
HEADER_ONLY = b"--- a/calc.ts\n+++ b/calc.ts\n"
CALC = (
    b"diff --git a/calc.ts b/calc.ts\n"
    b"--- a/calc.ts\n"
    b"+++ b/calc.ts\n"
    b"@@ -1,3 +1,3 @@\n"
    b" export function add(a: number, b: number) {\n"
    b"-  return a - b;\n"
    b"+  return a + b;\n"
    b" }\n"
)


def gate_failure(data: bytes, pointers: list[str]) -> PatchGateError:
    with pytest.raises(PatchGateError) as caught:
        check_gates(data, pointers)
    error = caught.value
    # Every failure names its gate three ways and is JSON-able as the contract wants.
    assert error.code == f"patch.{error.details['reason']}"
    assert error.details["reason"] in GATE_REASONS
    assert "\n" not in error.message
    orjson.dumps(error.to_json())
    return error


def test_reasons_are_the_contract_names() -> None:
    assert {Reason(r) for r in GATE_REASONS} == {
        Reason.NOT_A_UNIFIED_DIFF,
        Reason.PATCH_DOES_NOT_COVER_POINTERS,
        Reason.EMPTY_PATCH_HUNKS,
    }


# ---- gate 1: NOT_A_UNIFIED_DIFF -------------------------------------------------------


def test_gate1_49_bytes_of_prose_is_not_a_diff() -> None:
    assert len(PROSE_49) == 49
    error = gate_failure(PROSE_49, ["calc.ts"])
    assert error.details["reason"] == NOT_A_UNIFIED_DIFF
    assert "I reviewed calc.ts" in error.message


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\n\n",
        b"diff --git\n",  # a header word with no paths
        b"--- a/calc.ts\n",  # a source header with no target
        b"+++ b/calc.ts\n",  # a target header with no source
        b"@@ -1 +1 @@\n-a\n+b\n",  # a hunk with no file header
        b"Binary files a/x.png and b/x.png differ\n",  # plain diff's binary note only
        b"--- a/calc.ts\n+++ b/calc.ts\n@@ -1,2 +1,2 @@\n-a\n+b\n",  # hunk shorter than it says
        b"--- a/calc.ts\n+++ b/calc.ts\n@@ -1 +1 @@\n*a\n",  # not a hunk line
        b"--- a/c\n+++ b/c\n@@ -" + b"9" * 5000 + b" +1 @@\n-a\n",  # int() digit limit
    ],
    ids=[
        "empty",
        "blank-lines",
        "bare-diff-git",
        "source-only",
        "target-only",
        "hunk-without-header",
        "binary-note-only",
        "hunk-short",
        "bad-hunk-line",
        "huge-number",
    ],
)
def test_gate1_rejects_non_diffs(data: bytes) -> None:
    assert gate_failure(data, []).details["reason"] == NOT_A_UNIFIED_DIFF


def test_gate1_names_the_offending_line() -> None:
    data = b"--- a/calc.ts\n+++ b/calc.ts\n@@ -1 +1 @@\n-a\n*oops\n"
    error = gate_failure(data, ["calc.ts"])
    assert error.details["line"] == 5
    assert "line 5" in error.message
    assert "*oops" in error.message


def test_gate1_comes_before_gate2() -> None:
    # Prose that would also fail gate 2 reports gate 1: the gates run in order.
    assert gate_failure(PROSE_49, ["other.ts"]).details["reason"] == NOT_A_UNIFIED_DIFF


# ---- gate 2: PATCH_DOES_NOT_COVER_POINTERS ---------------------------------------------


def test_gate2_readme_patch_offered_for_calc_ts() -> None:
    check_gates(README_ONLY, ["README.md"])  # a fine patch for its own file
    error = gate_failure(README_ONLY, ["calc.ts"])
    assert error.details["reason"] == PATCH_DOES_NOT_COVER_POINTERS
    assert error.details["path"] == "calc.ts"
    assert error.details["touched"] == ["README.md"]
    assert "calc.ts" in error.message


def test_gate2_every_pointer_must_be_covered() -> None:
    check_gates(CALC, ["calc.ts"])
    error = gate_failure(CALC, ["calc.ts", "util.ts", "lib/x.ts"])
    assert error.details["missing"] == ["util.ts", "lib/x.ts"]
    assert error.details["path"] == "util.ts"


def test_gate2_no_pointers_is_covered() -> None:
    check_gates(CALC, [])


@pytest.mark.parametrize("pointer", ["calc.ts", "./calc.ts", "./calc.ts/", ".//calc.ts"])
def test_gate2_pointer_paths_are_normalised(pointer: str) -> None:
    check_gates(CALC, [pointer])


def test_gate2_patch_paths_are_normalised() -> None:
    data = b"--- ./src//calc.ts\n+++ ./src/./calc.ts\n@@ -1 +1 @@\n-a\n+b\n"
    assert parse_patch(data).touched_paths == {"src/calc.ts"}
    check_gates(data, ["src/calc.ts", "./src/calc.ts"])


def test_gate2_strips_a_and_b_prefixes_only_on_their_side() -> None:
    data = b"--- a/b/x\n+++ b/a/x\n@@ -1 +1 @@\n-a\n+b\n"
    assert parse_patch(data).touched_paths == {"b/x", "a/x"}


def test_gate2_unprefixed_diff() -> None:
    data = b"--- calc.ts.orig\t2024-01-01 00:00:00\n+++ calc.ts\t2024-01-02\n@@ -1 +1 @@\n-a\n+b\n"
    assert parse_patch(data).touched_paths == {"calc.ts.orig", "calc.ts"}
    check_gates(data, ["calc.ts"])


def test_gate2_rename_covers_both_names() -> None:
    data = (
        b"diff --git a/old.ts b/new.ts\n"
        b"similarity index 80%\n"
        b"rename from old.ts\n"
        b"rename to new.ts\n"
        b"index 1111111..2222222 100644\n"
        b"--- a/old.ts\n"
        b"+++ b/new.ts\n"
        b"@@ -1,2 +1,2 @@\n"
        b" keep\n"
        b"-old\n"
        b"+new\n"
    )
    assert parse_patch(data).touched_paths == {"old.ts", "new.ts"}
    check_gates(data, ["old.ts", "new.ts"])


def test_gate2_new_and_deleted_files_ignore_dev_null() -> None:
    data = (
        b"diff --git a/added.ts b/added.ts\n"
        b"new file mode 100644\n"
        b"index 0000000..1111111\n"
        b"--- /dev/null\n"
        b"+++ b/added.ts\n"
        b"@@ -0,0 +1 @@\n"
        b"+hello\n"
        b"diff --git a/gone.ts b/gone.ts\n"
        b"deleted file mode 100644\n"
        b"index 1111111..0000000\n"
        b"--- a/gone.ts\n"
        b"+++ /dev/null\n"
        b"@@ -1 +0,0 @@\n"
        b"-bye\n"
    )
    info = check_gates(data, ["added.ts", "gone.ts"])
    assert info.touched_paths == {"added.ts", "gone.ts"}
    assert "/dev/null" not in info.touched_paths
    assert gate_failure(data, ["dev/null"]).details["reason"] == PATCH_DOES_NOT_COVER_POINTERS


def test_gate2_plain_new_file_against_dev_null() -> None:
    data = b"--- /dev/null\n+++ b/new.ts\n@@ -0,0 +1,2 @@\n+a\n+b\n"
    assert check_gates(data, ["new.ts"]).touched_paths == {"new.ts"}


def test_gate2_git_quoted_paths_are_unquoted() -> None:
    data = (
        b'diff --git "a/t\\303\\251st \\"q\\".ts" "b/t\\303\\251st \\"q\\".ts"\n'
        b'--- "a/t\\303\\251st \\"q\\".ts"\n'
        b'+++ "b/t\\303\\251st \\"q\\".ts"\n'
        b"@@ -1 +1 @@\n-a\n+b\n"
    )
    check_gates(data, ['t\u00e9st "q".ts'])


def test_gate2_a_header_line_naming_another_file_does_not_cover_it() -> None:
    # In a git section the file is the one its "diff --git" line names.
    data = README_ONLY.replace(b"--- a/README.md", b"--- a/calc.ts")
    assert gate_failure(data, ["calc.ts"]).details["reason"] == PATCH_DOES_NOT_COVER_POINTERS


# ---- gate 3: EMPTY_PATCH_HUNKS ---------------------------------------------------------


def test_gate3_header_without_a_hunk() -> None:
    error = gate_failure(HEADER_ONLY, ["calc.ts"])
    assert error.details["reason"] == EMPTY_PATCH_HUNKS
    assert error.details["path"] == "calc.ts"
    assert error.details["line"] == 1
    assert "calc.ts" in error.message


def test_gate3_git_header_only() -> None:
    data = b"diff --git a/calc.ts b/calc.ts\nindex 1111111..2222222 100644\n"
    assert gate_failure(data, ["calc.ts"]).details["reason"] == EMPTY_PATCH_HUNKS


def test_gate3_hunk_with_only_context_lines() -> None:
    data = b"--- a/calc.ts\n+++ b/calc.ts\n@@ -1,2 +1,2 @@\n same\n same too\n"
    error = gate_failure(data, ["calc.ts"])
    assert error.details["reason"] == EMPTY_PATCH_HUNKS
    assert "no hunk with a + or - line" in error.message


def test_gate3_zero_length_hunk() -> None:
    data = b"--- a/calc.ts\n+++ b/calc.ts\n@@ -1,0 +1,0 @@\n"
    assert gate_failure(data, ["calc.ts"]).details["reason"] == EMPTY_PATCH_HUNKS


def test_gate3_binary_sections_are_empty() -> None:
    git_binary_note = (
        b"diff --git a/logo.png b/logo.png\n"
        b"index 1111111..2222222 100644\n"
        b"Binary files a/logo.png and b/logo.png differ\n"
    )
    git_binary_patch = (
        b"diff --git a/logo.png b/logo.png\n"
        b"index 1111111..2222222 100644\n"
        b"GIT binary patch\n"
        b"literal 5\n"
        b"McmZQzWMXCj00313jQ{`u\n"
        b"\n"
        b"literal 0\n"
        b"HcmV?d00001\n"
    )
    for data in (git_binary_note, git_binary_patch):
        error = gate_failure(data, ["logo.png"])
        assert error.details["reason"] == EMPTY_PATCH_HUNKS
        assert error.details["path"] == "logo.png"


def test_gate3_pure_rename_is_empty() -> None:
    data = b"diff --git a/old.ts b/new.ts\nsimilarity index 100%\nrename from old.ts\nrename to new.ts\n"
    error = gate_failure(data, ["old.ts", "new.ts"])
    assert error.details["reason"] == EMPTY_PATCH_HUNKS
    assert error.details["path"] == "new.ts"


def test_gate3_mode_change_only_is_empty() -> None:
    data = b"diff --git a/run.sh b/run.sh\nold mode 100644\nnew mode 100755\n"
    assert gate_failure(data, ["run.sh"]).details["reason"] == EMPTY_PATCH_HUNKS


def test_gate3_one_empty_section_among_good_ones() -> None:
    empty_section = b"diff --git a/util.ts b/util.ts\nindex 1111111..2222222 100644\n"
    data = CALC + empty_section + README_ONLY
    check_gates(CALC + README_ONLY, ["calc.ts", "README.md"])
    error = gate_failure(data, ["calc.ts", "README.md"])
    assert error.details["reason"] == EMPTY_PATCH_HUNKS
    assert error.details["path"] == "util.ts"
    assert error.details["line"] == CALC.count(b"\n") + 1


def test_gate3_comes_after_gate2() -> None:
    assert gate_failure(HEADER_ONLY, ["other.ts"]).details["reason"] == (
        PATCH_DOES_NOT_COVER_POINTERS
    )


# ---- encodings and line endings --------------------------------------------------------


def test_crlf_patch_passes_with_clean_paths() -> None:
    data = CALC.replace(b"\n", b"\r\n")
    info = check_gates(data, ["calc.ts"])
    assert info.touched_paths == {"calc.ts"}
    assert info.sha256 == hashlib.sha256(data).hexdigest()  # of the bytes as given


def test_crlf_header_only_still_empty() -> None:
    data = HEADER_ONLY.replace(b"\n", b"\r\n")
    assert gate_failure(data, ["calc.ts"]).details["reason"] == EMPTY_PATCH_HUNKS


def test_non_utf8_content_does_not_crash() -> None:
    data = b"--- a/latin.txt\n+++ b/latin.txt\n@@ -1 +1 @@\n-caf\xe9\n+caf\xe9 cr\xe8me \xff\xfe\n"
    assert check_gates(data, ["latin.txt"]).hunk_counts == {"latin.txt": 1}


def test_non_utf8_path_matches_the_same_bytes_as_a_pointer() -> None:
    data = b"--- a/caf\xe9.txt\n+++ b/caf\xe9.txt\n@@ -1 +1 @@\n-a\n+b\n"
    pointer = b"caf\xe9.txt".decode("utf-8", "surrogateescape")  # how argv would decode it
    check_gates(data, [pointer])
    error = gate_failure(data, ["cafe.txt"])
    assert error.details["touched"] == ["caf\\xe9.txt"]  # shown, and JSON-able


def test_non_utf8_garbage_is_not_a_diff() -> None:
    assert gate_failure(b"\xff\xfe\x00\x80garbage\n", []).details["reason"] == NOT_A_UNIFIED_DIFF


def test_hunk_lines_that_look_like_headers_stay_content() -> None:
    data = b"--- a/notes.md\n+++ b/notes.md\n@@ -1 +1 @@\n--- a/calc.ts\n+++ b/calc.ts\n"
    info = check_gates(data, ["notes.md"])
    assert info.touched_paths == {"notes.md"}
    assert gate_failure(data, ["calc.ts"]).details["reason"] == PATCH_DOES_NOT_COVER_POINTERS


# ---- PatchInfo and helpers -------------------------------------------------------------


def test_patch_info_counts_hunks_per_file() -> None:
    two_hunks = b"--- a/calc.ts\n+++ b/calc.ts\n@@ -1 +1 @@\n-a\n+b\n@@ -10 +10 @@\n-c\n+d\n"
    info = check_gates(two_hunks + README_ONLY, ["calc.ts", "README.md"])
    assert info.hunk_counts == {"calc.ts": 2, "README.md": 1}
    assert info.sha256 == hashlib.sha256(two_hunks + README_ONLY).hexdigest()
    assert [s.line for s in info.sections] == [1, 9]


def test_trailing_text_after_a_diff_is_tolerated() -> None:
    # git format-patch ends with a signature; mail bodies carry text before the diff.
    # Like git apply and patch(1), lines after a complete hunk that start no new section
    # are ignored: they add no path and no change, so they cannot help a patch pass.
    data = b"Subject: fix add\n\nA note.\n---\n" + CALC + b"-- \n2.39.5\n\n"
    check_gates(data, ["calc.ts"])
    extra = CALC + b"+not counted\n"
    assert check_gates(extra, ["calc.ts"]).touched_paths == {"calc.ts"}


@pytest.mark.parametrize(
    ("given", "expected"),
    [("x", "x"), ("./x", "x"), ("a//b", "a/b"), ("a/./b/", "a/b"), ("a/../b", "b")],
)
def test_normalise_path(given: str, expected: str) -> None:
    assert normalise_path(given) == expected


def test_exit_codes_for_a_gate_failure() -> None:
    error = gate_failure(PROSE_49, ["calc.ts"])
    assert exit_code_for(error, runs_task=False) == EX_USAGE  # submit: bad input
    assert exit_code_for(error, runs_task=True) == EX_FERRY_FAILED  # run: 125
