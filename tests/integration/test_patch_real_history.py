"""The gates against real git output: a repository built here from the text of the
running interpreter's standard library, with more than 300 commits of text edits
(modify, add, delete, rename with edits), some with spaces and non-ASCII in names.

For every commit, the patch git prints passes the three gates with pointers = the
files git says it touches, and removing any one file section makes gate 2 fail.

The history is written with one ``git fast-import`` and read back with one ``git log``
(plus a sample of ``git diff A^ A`` / ``git show`` calls checked to print the same
bytes), so the test stays quick.
"""

from __future__ import annotations

import os
import random
import subprocess
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ferry.core.errors import PatchGateError
from ferry.core.patch import EMPTY_PATCH_HUNKS, PATCH_DOES_NOT_COVER_POINTERS, check_gates

COMMITS = 320
SEED = 20240605
SOURCE_BYTES_MAX = 24_000
FILE_LINES_MAX = 160
EXTRA_NAMES = ["notes and ideas.py", "donn\u00e9es.py", "caf\u00e9 cr\u00e8me.py"]

pytestmark = pytest.mark.timeout(120)


def stdlib_texts() -> list[list[str]]:
    """Lines of the interpreter's own Lib/*.py files that are plain UTF-8 text."""
    texts = []
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        data = path.read_bytes()
        if not 2_000 <= len(data) <= SOURCE_BYTES_MAX or b"\0" in data or b"\r" in data:
            continue
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            continue
        texts.append(text.splitlines(keepends=True))
    assert len(texts) >= 40, "too few stdlib sources to build a history from"
    return texts


@dataclass
class History:
    """Builds a fast-import stream and remembers which paths each commit touched."""

    rng: random.Random
    texts: list[list[str]]
    files: dict[str, list[str]] = field(default_factory=dict)
    stream: list[bytes] = field(default_factory=list)
    touched: list[set[str]] = field(default_factory=list)
    renames: int = 0
    serial: int = 0

    def chunk(self) -> list[str]:
        source = self.rng.choice(self.texts)
        start = self.rng.randrange(0, max(1, len(source) - 20))
        lines = source[start : start + self.rng.randint(20, FILE_LINES_MAX)]
        if not lines[-1].endswith("\n"):
            lines[-1] += "\n"
        return lines

    def new_name(self) -> str:
        self.serial += 1
        if self.serial <= len(EXTRA_NAMES):
            return f"pkg/{EXTRA_NAMES[self.serial - 1]}"
        directory = self.rng.choice(["", "lib/", "lib/sub/", "tools/"])
        return f"{directory}mod_{self.serial:04d}.py"

    def edited(self, lines: list[str]) -> list[str]:
        """A few line-level edits; enough lines stay that git pairs renames (>50%)."""
        lines = list(lines)
        for _ in range(self.rng.randint(1, 4)):
            at = self.rng.randrange(0, len(lines))
            action = self.rng.choice(["delete", "insert", "replace"])
            if action == "delete" and len(lines) > 12:
                del lines[at : at + self.rng.randint(1, 3)]
            elif action == "insert":
                lines[at:at] = self.chunk()[: self.rng.randint(1, 4)]
            else:
                lines[at] = self.rng.choice(self.rng.choice(self.texts))
                if not lines[at].endswith("\n"):
                    lines[at] += "\n"
        return lines

    def commit(self, ops: list[tuple[str, str, list[str] | None]], message: str) -> None:
        mark = len(self.touched) + 1
        when = 1_700_000_000 + mark * 60
        body = message.encode()
        head = [
            b"commit refs/heads/main\n",
            f"mark :{mark}\n".encode(),
            f"author Ferry Test <test@ferry.invalid> {when} +0000\n".encode(),
            f"committer Ferry Test <test@ferry.invalid> {when} +0000\n".encode(),
            b"data %d\n" % len(body) + body + b"\n",
        ]
        if mark > 1:
            head.append(f"from :{mark - 1}\n".encode())
        self.stream += head
        paths: set[str] = set()
        for kind, path, lines in ops:
            paths.add(path)
            if kind == "D":
                self.stream.append(f"D {path}\n".encode())
                del self.files[path]
            else:
                assert lines is not None
                data = "".join(lines).encode()
                self.stream.append(f"M 100644 inline {path}\n".encode())
                self.stream.append(b"data %d\n" % len(data) + data + b"\n")
                self.files[path] = lines
        self.touched.append(paths)

    def random_commit(self) -> None:
        ops: list[tuple[str, str, list[str] | None]] = []
        busy: set[str] = set()
        for _ in range(self.rng.randint(2, 3)):
            free = sorted(set(self.files) - busy)
            kind = self.rng.choices(["modify", "add", "delete", "rename"], [6, 2, 1, 2])[0]
            if kind == "delete" and len(free) > 20:
                path = self.rng.choice(free)
                ops.append(("D", path, None))
                busy.add(path)
            elif kind == "rename" and len(free) > 5:
                old = self.rng.choice(free)
                new = self.new_name()
                ops += [("D", old, None), ("M", new, self.edited(self.files[old]))]
                busy |= {old, new}
                self.renames += 1
            elif kind == "add" or not free:
                new = self.new_name()
                ops.append(("M", new, self.chunk()))
                busy.add(new)
            else:
                path = self.rng.choice(free)
                lines = self.edited(self.files[path])
                if lines == self.files[path]:
                    lines = [*lines, "# edited\n"]
                ops.append(("M", path, lines))
                busy.add(path)
        self.commit(ops, f"change {len(self.touched) + 1}\n")


def git(repo: Path, *args: str, stdin: bytes | None = None) -> bytes:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(repo),  # no user config: no mnemonic prefixes, no colour, no pager
        "GIT_CONFIG_NOSYSTEM": "1",
        "LC_ALL": "C",
    }
    return subprocess.run(
        ["git", *args], cwd=repo, env=env, input=stdin, capture_output=True, check=True
    ).stdout


@dataclass(frozen=True)
class CommitPatch:
    sha: str
    patch: bytes
    touched: frozenset[str]  # what git's --name-status says, both sides of renames


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, History, list[CommitPatch]]:
    repo = tmp_path_factory.mktemp("history")
    git(repo, "init", "-q", "-b", "main")
    built = History(random.Random(SEED), stdlib_texts())
    built.commit([("M", built.new_name(), built.chunk()) for _ in range(30)], "seed\n")
    for _ in range(COMMITS):
        built.random_commit()
    git(repo, "fast-import", "--quiet", stdin=b"".join(built.stream) + b"done\n")

    diff_options = ["-M", "--no-color", "--no-ext-diff", "--reverse"]
    log = git(repo, "log", "-p", *diff_options, "--format=%x00%x00%H")
    names = git(repo, "log", "--name-status", "-z", *diff_options, "--format=%x01%H")
    touched_by_sha = parse_name_status(names)
    commits = []
    for chunk in log.split(b"\0\0")[1:]:
        sha, _, patch = chunk.partition(b"\n")
        commits.append(CommitPatch(sha.decode(), patch.lstrip(b"\n"), touched_by_sha[sha.decode()]))
    return repo, built, commits[1:]  # the seed commit has no parent to diff against


def parse_name_status(output: bytes) -> dict[str, frozenset[str]]:
    result = {}
    for record in output.split(b"\x01")[1:]:
        tokens = [t for t in record.split(b"\0") if t.strip(b"\n")]
        sha, rest = tokens[0].decode().strip(), [t.lstrip(b"\n") for t in tokens[1:]]
        paths: set[str] = set()
        i = 0
        while i < len(rest):
            status = rest[i].decode()
            width = 2 if status[0] in "RC" else 1
            paths.update(p.decode("utf-8", "surrogateescape") for p in rest[i + 1 : i + 1 + width])
            i += 1 + width
        result[sha] = frozenset(paths)
    return result


def split_sections(patch: bytes) -> list[bytes]:
    lines = patch.splitlines(keepends=True)
    sections: list[list[bytes]] = []
    for line in lines:
        if line.startswith(b"diff --git ") or not sections:
            sections.append([])
        sections[-1].append(line)
    return [b"".join(section) for section in sections]


def test_the_history_is_real_and_large_enough(
    history: tuple[Path, History, list[CommitPatch]],
) -> None:
    _, built, commits = history
    assert len(commits) >= 300
    assert built.renames >= 30
    assert [c.touched for c in commits] == [frozenset(t) for t in built.touched[1:]]
    assert all(len(c.touched) >= 2 for c in commits)
    patches = b"".join(c.patch for c in commits)
    for marker in (b"\nrename from ", b"\ndeleted file mode ", b"\nnew file mode ", b'"a/pkg/'):
        assert marker in patches, marker


def test_every_commit_passes_the_gates_for_the_files_it_touches(
    history: tuple[Path, History, list[CommitPatch]],
) -> None:
    _, _, commits = history
    for commit in commits:
        info = check_gates(commit.patch, sorted(commit.touched))
        assert info.touched_paths == commit.touched, commit.sha
        assert all(section.changed_hunks >= 1 for section in info.sections)


def test_removing_any_one_section_fails_gate2(
    history: tuple[Path, History, list[CommitPatch]],
) -> None:
    _, _, commits = history
    checked = 0
    for commit in commits:
        sections = split_sections(commit.patch)
        assert len(sections) >= 2, commit.sha
        for k in range(len(sections)):
            rest = b"".join(s for i, s in enumerate(sections) if i != k)
            with pytest.raises(PatchGateError) as caught:
                check_gates(rest, sorted(commit.touched))
            assert caught.value.details["reason"] == PATCH_DOES_NOT_COVER_POINTERS, commit.sha
            checked += 1
    assert checked >= 600


def test_git_diff_and_git_show_print_the_same_patches(
    history: tuple[Path, History, list[CommitPatch]],
) -> None:
    repo, _, commits = history
    for commit in random.Random(SEED).sample(commits, 8):
        diff = git(repo, "diff", "-M", "--no-color", f"{commit.sha}^", commit.sha)
        show = git(repo, "show", "-M", "--no-color", "--format=", commit.sha)
        assert diff == commit.patch == show.lstrip(b"\n"), commit.sha
        check_gates(diff, sorted(commit.touched))


def test_a_pure_rename_from_git_is_an_empty_section(tmp_path: Path) -> None:
    git(tmp_path, "init", "-q", "-b", "main")
    (tmp_path / "calc.ts").write_text("".join(f"line {i}\n" for i in range(40)))
    git(tmp_path, "add", "calc.ts")
    git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    git(tmp_path, "mv", "calc.ts", "calculator.ts")
    patch = git(tmp_path, "diff", "-M", "--cached")
    assert b"rename from calc.ts" in patch
    with pytest.raises(PatchGateError) as caught:
        check_gates(patch, ["calc.ts", "calculator.ts"])
    assert caught.value.details["reason"] == EMPTY_PATCH_HUNKS
