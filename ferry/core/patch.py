"""The three patch gates (pure: bytes in, a PatchInfo or a PatchGateError out).

A self-contained patch may stand in for pinned files that changed on disk, so it must be
proven to be a real diff of those files.  The gates run in this order; the first that
fails raises :class:`ferry.core.errors.PatchGateError` with ``code`` ``patch.<REASON>`` and
``details["reason"]`` the contract's reason name:

1. ``NOT_A_UNIFIED_DIFF``: the bytes do not parse as a unified diff (unidiff raises), or
   no file section starts with a ``diff --git`` or a ``---``/``+++`` header.
2. ``PATCH_DOES_NOT_COVER_POINTERS``: some declared pointer is not among the paths the
   patch touches.  Touched paths are both sides of every section (so both names of a
   rename), with git quoting undone, ``a/`` stripped from the old side and ``b/`` from
   the new side, ``/dev/null`` ignored, and normalised (``./x`` == ``x``, ``x//y`` ==
   ``x/y``).  Other prefixes (``--no-prefix`` aside: git's mnemonic ``i/``, ``w/``, ...)
   are not stripped, so such a patch fails closed here.
3. ``EMPTY_PATCH_HUNKS``: some file section has no ``@@`` hunk with a ``+`` or ``-`` line.
   Header-only sections, binary sections (``Binary files ... differ``, ``GIT binary
   patch``), pure renames, copies and mode changes carry no such hunk and so count as
   empty: they prove nothing about the file's text.

Decoding: bytes are decoded as UTF-8 with ``surrogateescape``, the same rule Python
uses for file names on Linux, so nothing crashes and a non-UTF-8 path in a patch still
matches the same bytes given as ``--pointer``.  ``\\r\\n`` is read as ``\\n`` (a CRLF
patch has the same structure); the SHA-256 is always of the exact bytes given.
"""

from __future__ import annotations

import hashlib
import posixpath
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from unidiff.errors import UnidiffParseError
from unidiff.patch import PatchedFile, PatchSet

from ferry.core.errors import PatchGateError

NOT_A_UNIFIED_DIFF = "NOT_A_UNIFIED_DIFF"
PATCH_DOES_NOT_COVER_POINTERS = "PATCH_DOES_NOT_COVER_POINTERS"
EMPTY_PATCH_HUNKS = "EMPTY_PATCH_HUNKS"
GATE_REASONS = (NOT_A_UNIFIED_DIFF, PATCH_DOES_NOT_COVER_POINTERS, EMPTY_PATCH_HUNKS)

DEV_NULL = "/dev/null"
_SHOWN_CHARS_MAX = 80  # how much of an offending line a message quotes
_C_ESCAPES = {"a": 7, "b": 8, "t": 9, "n": 10, "v": 11, "f": 12, "r": 13, '"': 34, "\\": 92}


@dataclass(frozen=True)
class FileSection:
    """One file section of a patch: its two sides (None for /dev/null) and its hunks."""

    old_path: str | None
    new_path: str | None
    line: int  # 1-based line of the patch where the section starts
    hunks: int
    changed_hunks: int  # hunks with at least one + or - line

    @property
    def path(self) -> str:
        """The name to show: the new side, else the old one."""
        return self.new_path or self.old_path or ""


@dataclass(frozen=True)
class PatchInfo:
    """A parsed patch: the hash of its exact bytes and the files it touches."""

    sha256: str  # of the exact bytes
    sections: tuple[FileSection, ...]

    @property
    def touched_paths(self) -> frozenset[str]:
        return frozenset(
            side for s in self.sections for side in (s.old_path, s.new_path) if side is not None
        )

    @property
    def hunk_counts(self) -> Mapping[str, int]:
        """Hunks per section, keyed by :attr:`FileSection.path`."""
        counts: dict[str, int] = {}
        for section in self.sections:
            counts[section.path] = counts.get(section.path, 0) + section.hunks
        return counts


def normalise_path(path: str) -> str:
    """The comparable form of a relative path: ``./x`` -> ``x``, ``x//y/`` -> ``x/y``."""
    return posixpath.normpath(path) if path else path


def parse_patch(data: bytes) -> PatchInfo:
    """Parse a patch; raise ``patch.NOT_A_UNIFIED_DIFF`` (gate 1) if it is not one."""
    sha256 = hashlib.sha256(data).hexdigest()
    lines = _split_lines(data.decode("utf-8", "surrogateescape").replace("\r\n", "\n"))
    counter = _CountingLines(lines)
    try:
        # metadata_only: unidiff still validates every hunk line and the hunk lengths,
        # it only skips building Line objects.
        patch_set = PatchSet(counter, metadata_only=True)
    except (UnidiffParseError, ValueError) as exc:
        # ValueError: int() of a hunk header number longer than Python's digit limit.
        line_no = max(counter.read, 1)
        why = str(exc).split(":", 1)[0]  # unidiff appends the raw line: quoted below
        raise _gate_error(
            NOT_A_UNIFIED_DIFF,
            f"not a unified diff: line {line_no}: {why} ({_shown(lines, line_no)!r})",
            line=line_no,
            text=_shown(lines, line_no),
        ) from None
    headed = [f for f in patch_set if _starts_with_header(lines, f)]
    if not headed:
        raise _gate_error(
            NOT_A_UNIFIED_DIFF,
            "not a unified diff: no 'diff --git' and no '---'/'+++' file header"
            + (f" (first line: {_shown(lines, 1)!r})" if lines else " (empty patch)"),
            line=1,
            text=_shown(lines, 1),
        )
    return PatchInfo(sha256=sha256, sections=tuple(_section(lines, f) for f in patch_set))


def check_gates(data: bytes, pointers: Sequence[str]) -> PatchInfo:
    """Run the three gates in order; return the parsed patch if all hold.

    ``pointers`` are paths relative to the task's working directory.
    """
    info = parse_patch(data)
    touched = info.touched_paths
    missing = [p for p in dict.fromkeys(normalise_path(p) for p in pointers) if p not in touched]
    if missing:
        raise _gate_error(
            PATCH_DOES_NOT_COVER_POINTERS,
            f"the patch does not touch pointer {missing[0]!r}"
            + (f" (nor {len(missing) - 1} more)" if len(missing) > 1 else "")
            + f"; it touches: {_some(sorted(touched))}",
            path=missing[0],
            missing=missing,
            touched=sorted(touched),
        )
    for section in info.sections:
        if section.changed_hunks == 0:
            what = "no hunk" if section.hunks == 0 else "no hunk with a + or - line"
            raise _gate_error(
                EMPTY_PATCH_HUNKS,
                f"the section for {section.path!r} (line {section.line}) has {what}",
                path=section.path,
                line=section.line,
            )
    return info


def _gate_error(reason: str, message: str, **details: object) -> PatchGateError:
    safe = {key: _json_safe_value(value) for key, value in details.items()}
    return PatchGateError(
        json_safe(message), code=f"patch.{reason}", details={"reason": reason, **safe}
    )


def _json_safe_value(value: object) -> object:
    if isinstance(value, str):
        return json_safe(value)
    if isinstance(value, list):
        return [_json_safe_value(item) for item in value]
    return value


def json_safe(text: str) -> str:
    """``text`` with undecodable bytes (surrogate escapes) shown as ``\\xNN``: JSON can
    carry it (orjson refuses lone surrogates) and a terminal shows it."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


class _CountingLines:
    """Feeds lines to unidiff and remembers how far it read (to name the bad line)."""

    def __init__(self, lines: Iterable[str]) -> None:
        self._lines = lines
        self.read = 0

    def __iter__(self) -> Iterator[str]:
        for line in self._lines:
            self.read += 1
            yield line


def _split_lines(text: str) -> list[str]:
    # Only "\n" ends a line: str.splitlines() would also split on \x0b, \x1c, U+2028...
    parts = text.split("\n")
    lines = [part + "\n" for part in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def _shown(lines: Sequence[str], line_no: int) -> str:
    if not 1 <= line_no <= len(lines):
        return ""
    return _clip(lines[line_no - 1].rstrip("\n"))


def _some(names: Sequence[str], shown_max: int = 5) -> str:
    if not names:
        return "nothing"
    more = f" and {len(names) - shown_max} more" if len(names) > shown_max else ""
    return ", ".join(names[:shown_max]) + more


def _clip(text: str) -> str:
    return text if len(text) <= _SHOWN_CHARS_MAX else text[:_SHOWN_CHARS_MAX] + "..."


def _starts_with_header(lines: Sequence[str], patched: PatchedFile) -> bool:
    # unidiff also opens a section at a bare "Binary files X and Y differ" line; gate 1
    # asks for a real file header somewhere.
    line_no = patched.diff_line_no
    if line_no is None or not 1 <= line_no <= len(lines):
        return False
    return lines[line_no - 1].startswith(("diff --git ", "+++ "))


def _section(lines: Sequence[str], patched: PatchedFile) -> FileSection:
    changed = sum(1 for hunk in patched if hunk.added + hunk.removed > 0)
    line_no = patched.diff_line_no or 0
    if line_no >= 2 and lines[line_no - 1].startswith("+++ "):
        line_no -= 1  # a plain section starts at its "---" line, one before the "+++"
    return FileSection(
        old_path=_side(patched.source_file, "a/"),
        new_path=_side(patched.target_file, "b/"),
        line=line_no,
        hunks=len(patched),
        changed_hunks=changed,
    )


def _side(raw: str | None, prefix: str) -> str | None:
    if raw is None:
        return None
    name = _unquote(raw)
    if name == DEV_NULL or not name:
        return None
    if name.startswith(prefix):
        name = name[len(prefix) :]
    return normalise_path(name) or None


def _unquote(name: str) -> str:
    """Undo git's C-style quoting ("a/t\\303\\251st") back to the file name."""
    if len(name) < 2 or not (name.startswith('"') and name.endswith('"')):
        return name
    body = name[1:-1]
    out = bytearray()
    i = 0
    while i < len(body):
        char = body[i]
        if char != "\\" or i + 1 >= len(body):
            out += char.encode("utf-8", "surrogateescape")
            i += 1
            continue
        nxt = body[i + 1]
        octal = body[i + 1 : i + 4]
        if len(octal) == 3 and all(c in "01234567" for c in octal) and int(octal, 8) < 256:
            out.append(int(octal, 8))
            i += 4
        elif nxt in _C_ESCAPES:
            out.append(_C_ESCAPES[nxt])
            i += 2
        else:  # not an escape git writes: keep it as it stands
            out += char.encode("utf-8", "surrogateescape")
            i += 1
    return out.decode("utf-8", "surrogateescape")
