"""Properties of the patch gates: real patches pass for their own paths; garbage,
truncated patches and patches with hunks stripped never pass; nothing but
PatchGateError ever escapes."""

from __future__ import annotations

import difflib
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from ferry.core.errors import PatchGateError
from ferry.core.patch import (
    EMPTY_PATCH_HUNKS,
    NOT_A_UNIFIED_DIFF,
    PATCH_DOES_NOT_COVER_POINTERS,
    check_gates,
)

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@dataclass(frozen=True)
class Section:
    path: str
    header: list[str]  # the lines before the first hunk
    hunks: list[list[str]]  # each hunk: its "@@" line, then its body lines

    def text(self, *, with_hunks: bool = True) -> str:
        lines = list(self.header)
        if with_hunks:
            lines += [line for hunk in self.hunks for line in hunk]
        return "".join(lines)


@dataclass(frozen=True)
class Patch:
    sections: list[Section]

    @property
    def paths(self) -> list[str]:
        return [s.path for s in self.sections]

    def data(self, sections: list[Section] | None = None) -> bytes:
        return "".join(s.text() for s in (sections or self.sections)).encode()

    def last_section_needed_bytes(self) -> int:
        """A cut at or before this byte offset leaves the last section without a
        complete first hunk: the start of that hunk's last line."""
        before = "".join(s.text() for s in self.sections[:-1])
        last = self.sections[-1]
        first_hunk = last.hunks[0]
        return len((before + last.text(with_hunks=False) + "".join(first_hunk[:-1])).encode())


line_text = st.text(
    alphabet=st.characters(blacklist_categories=["Cs"], blacklist_characters="\n\r"),
    max_size=30,
)
file_lines = st.lists(line_text.map(lambda t: t + "\n"), max_size=12)
path_part = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_-", min_size=1, max_size=8)
file_path = st.lists(path_part, min_size=1, max_size=3).map("/".join)


@st.composite
def sections(draw: st.DrawFn, path: str) -> Section:
    old = draw(file_lines)
    new = draw(file_lines)
    assume(old != new)
    git_style = draw(st.booleans())
    source = "/dev/null" if not old and draw(st.booleans()) else f"a/{path}"
    target = (
        "/dev/null" if not new and source != "/dev/null" and draw(st.booleans()) else f"b/{path}"
    )
    lines = list(
        difflib.unified_diff(old, new, source, target, n=draw(st.integers(0, 3)), lineterm="\n")
    )
    # difflib writes "--- a/x" and "+++ b/x" followed by hunks starting at "@@".
    header = lines[:2]
    if git_style:
        if source == "/dev/null":
            mode = ["new file mode 100644\n", "index 0000000..2222222\n"]
        elif target == "/dev/null":
            mode = ["deleted file mode 100644\n", "index 1111111..0000000\n"]
        else:
            mode = ["index 1111111..2222222 100644\n"]
        header = [f"diff --git a/{path} b/{path}\n", *mode, *header]
    hunks: list[list[str]] = []
    for line in lines[2:]:
        if line.startswith("@@"):
            hunks.append([line])
        else:
            hunks[-1].append(line)
    return Section(path=path, header=header, hunks=hunks)


@st.composite
def patches(draw: st.DrawFn) -> Patch:
    paths = draw(st.lists(file_path, min_size=1, max_size=4, unique=True))
    return Patch([draw(sections(path)) for path in paths])


def is_git(section: Section) -> bool:
    return section.header[0].startswith("diff --git ")


def gate_reason(data: bytes, pointers: list[str]) -> str | None:
    """None if the patch passes; else the failing gate. Any other exception escapes."""
    try:
        check_gates(data, pointers)
    except PatchGateError as error:
        return str(error.details["reason"])
    return None


@SETTINGS
@given(patches())
def test_a_real_patch_passes_for_its_own_paths(patch: Patch) -> None:
    info = check_gates(patch.data(), patch.paths)
    assert info.touched_paths == set(patch.paths)
    assert [s.hunks for s in info.sections] == [len(s.hunks) for s in patch.sections]
    # ... and for any subset of them, CRLF or not.
    assert gate_reason(patch.data().replace(b"\n", b"\r\n"), patch.paths[:1]) is None


@SETTINGS
@given(patches(), st.data())
def test_truncation_that_loses_a_sections_hunks_never_passes(
    patch: Patch, data: st.DataObject
) -> None:
    cut = data.draw(st.integers(0, patch.last_section_needed_bytes()), label="cut")
    assert gate_reason(patch.data()[:cut], patch.paths) is not None


@SETTINGS
@given(patches(), st.data())
def test_any_truncation_fails_only_with_a_gate_error(patch: Patch, data: st.DataObject) -> None:
    whole = patch.data()
    cut = data.draw(st.integers(0, len(whole)), label="cut")
    gate_reason(whole[:cut], patch.paths)  # passing is allowed after the last section


@SETTINGS
@given(patches(), st.data())
def test_a_section_with_its_hunks_stripped_never_passes(patch: Patch, data: st.DataObject) -> None:
    k = data.draw(st.integers(0, len(patch.sections) - 1), label="section")
    stripped = "".join(s.text(with_hunks=(i != k)) for i, s in enumerate(patch.sections)).encode()
    following = patch.sections[k + 1] if k + 1 < len(patch.sections) else None
    if is_git(patch.sections[k]) and following is not None and not is_git(following):
        # A hunkless git header followed by plain "---"/"+++" lines reads as one section
        # whose headers disagree (not a diff at all), or as one section of the second
        # path, which leaves the first path uncovered.  (git itself never mixes the
        # two.)  Refused either way.
        assert gate_reason(stripped, patch.paths) in (
            EMPTY_PATCH_HUNKS,
            NOT_A_UNIFIED_DIFF,
            PATCH_DOES_NOT_COVER_POINTERS,
        )
    else:
        assert gate_reason(stripped, patch.paths) == EMPTY_PATCH_HUNKS


@SETTINGS
@given(patches(), st.data())
def test_a_section_with_its_change_lines_stripped_never_passes(
    patch: Patch, data: st.DataObject
) -> None:
    k = data.draw(st.integers(0, len(patch.sections) - 1), label="section")
    target = patch.sections[k]
    hunks = [[line for line in hunk if not line.startswith(("+", "-"))] for hunk in target.hunks]
    mutated = [
        *patch.sections[:k],
        Section(target.path, target.header, hunks),
        *patch.sections[k + 1 :],
    ]
    assert gate_reason(patch.data(mutated), patch.paths) is not None


@SETTINGS
@given(patches(), st.data())
def test_a_missing_section_fails_gate2(patch: Patch, data: st.DataObject) -> None:
    k = data.draw(st.integers(0, len(patch.sections) - 1), label="section")
    rest = [s for i, s in enumerate(patch.sections) if i != k]
    expected = PATCH_DOES_NOT_COVER_POINTERS if rest else NOT_A_UNIFIED_DIFF
    assert gate_reason("".join(s.text() for s in rest).encode(), patch.paths) == expected


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=4000))
def test_random_bytes_never_pass(garbage: bytes) -> None:
    assert gate_reason(garbage, ["calc.ts"]) is not None
    gate_reason(garbage, [])  # never anything but a gate error


DIFFISH_LINES = [
    "diff --git a/x b/x",
    "diff --git a/x b/y",
    "--- a/x",
    "+++ b/x",
    "--- /dev/null",
    "+++ /dev/null",
    "@@ -1 +1 @@",
    "@@ -1,2 +1,2 @@",
    "@@ -0,0 +1 @@",
    "@@ -1,0 +1,0 @@",
    "+a",
    "-a",
    " a",
    "",
    "new file mode 100644",
    "deleted file mode 100644",
    "rename from x",
    "rename to y",
    "Binary files a/x and b/x differ",
    "GIT binary patch",
    "\\ No newline at end of file",
    "index 1..2 100644",
]


@settings(max_examples=400, deadline=None)
@given(
    st.lists(st.one_of(st.sampled_from(DIFFISH_LINES), line_text), max_size=30),
    st.sampled_from(["\n", "\r\n"]),
)
def test_diff_shaped_garbage_passes_only_with_real_changes(lines: list[str], eol: str) -> None:
    data = "".join(line + eol for line in lines).encode()
    try:
        info = check_gates(data, ["x"])
    except PatchGateError:
        return
    assert info.sections
    assert all(section.changed_hunks >= 1 for section in info.sections)
    assert any(line.startswith(("+", "-")) for line in lines)


@pytest.mark.parametrize("size", [0, 1, 49, 4096])
def test_zero_and_nul_filled_bytes_are_not_a_diff(size: int) -> None:
    # What a torn write leaves behind.
    assert gate_reason(b"\0" * size, []) == NOT_A_UNIFIED_DIFF
