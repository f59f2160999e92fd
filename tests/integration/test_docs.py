"""Docs that cannot rot: every Python example runs, every reference row is described, no process talk.

The reference pages are generated from the code (``docs/_gen/reference.py``); the tests here fail when a
setting, a CLI argument or a SQL column has nothing to say for itself. Every fenced ``python`` block of
README.md and ``docs/`` runs in a fresh interpreter against a real nats-server and daemon, unless a
``<!-- not-run: reason -->`` comment right above it says why not. The SQL recipes are bound against the
current schema. And the tracked files are grepped for work-session and issue numbers.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pytest
from docs_gen import load_reference
from support import serving

ROOT = Path(__file__).resolve().parents[2]
reference = load_reference()

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
BLOCK_S = 180
"""A block's deadline: imports of torch and the daemon's packages take seconds on a loaded machine."""

_FENCE = re.compile(
    r"(?P<marker><!--\s*not-run:(?P<why>.*?)-->\s*\n)?```(?P<lang>[\w-]*)\n(?P<code>.*?)^```", re.S | re.M
)

PROCESS_WORDS = re.compile(
    # "stop 43", "stops 33-34", but not a duration ("stops 3 s later")
    r"(?<!-)\bstops? \d+(?:-\d+)?\b(?!\s*(?:s|ms|µs|min|h|%|x|steps?|seconds?|minutes?|times?)\b)"
    r"|clean-clone|\bissues? \d+|work sessions?|\bthe issue's\b|\battack rounds?\b",
    re.I,
)
"""How a file would mention how it was built: numbered work sessions, issues, the CI runs of a session."""


@dataclass(frozen=True)
class Block:
    path: Path
    line: int
    lang: str
    code: str
    not_run: str | None

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks(lang: str) -> list[Block]:
    """Every fenced block of ``lang`` in README.md and docs/, with the reason it must not run, if given."""
    found = []
    for path in DOCS:
        text = path.read_text()
        for m in _FENCE.finditer(text):
            if m.group("lang") == lang:
                line = text.count("\n", 0, m.start("code"))
                why = m.group("why").strip() if m.group("marker") else None
                found.append(Block(path, line, lang, m.group("code"), why))
    return found


PYTHON = blocks("python")
RUN = [b for b in PYTHON if b.not_run is None]
NOT_RUN = [b for b in PYTHON if b.not_run is not None]


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real nats-server and daemon for the examples (their ``close()`` then has a stream to deliver to)."""
    with serving(tmp_path_factory.mktemp("docs-broker")) as daemon:
        yield daemon.nats_url


@pytest.mark.parametrize("block", RUN, ids=[b.id for b in RUN])
def test_every_python_example_runs(block: Block, broker: str, tmp_path: Path) -> None:
    """Each example runs to exit 0 in a fresh interpreter, against a real broker, within its deadline."""
    env = {**os.environ, "VIGIL_NATS_URL": broker, "VIGIL_SPILL_DIR": str(tmp_path / "spill")}
    env.pop("VIGIL_RUN_ID", None)
    script = tmp_path / "example.py"
    script.write_text(block.code)
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=BLOCK_S
    )
    assert done.returncode == 0, f"{block.id} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"


def test_examples_that_do_not_run_say_why_and_stay_few() -> None:
    """A block left out says why; most examples run (the fragments are of whole scripts the suite runs)."""
    assert RUN, "no runnable examples found"
    for block in NOT_RUN:
        assert len(block.not_run or "") >= 10, f"{block.id}: <!-- not-run: ... --> needs a reason"
    assert len(NOT_RUN) <= len(RUN), f"{len(NOT_RUN)} blocks not run against {len(RUN)} run"


def test_a_not_run_marker_sits_right_above_a_python_block() -> None:
    """A marker that no block follows (a typo, a moved block) would silently mark nothing."""
    for path in DOCS:
        text = path.read_text()
        markers = len(re.findall(r"^<!--\s*not-run:", text, re.M))
        assert markers == sum(1 for b in NOT_RUN if b.path == path), f"{path}: a not-run marker above no block"


def test_the_readme_example_is_the_agent_api() -> None:
    """README.md shows the agent: a runnable example that starts it, logs steps and closes it."""
    readme = [b for b in RUN if b.path.name == "README.md"]
    assert readme, "README.md has no runnable python example"
    assert any("trainvigil.init(" in b.code and ".log(" in b.code and ".close(" in b.code for b in readme)
    assert all(len(b.code.strip().splitlines()) <= 12 for b in readme)


def test_every_setting_has_a_description() -> None:
    """Agent options, daemon keys and every detector's settings: none without a description."""
    settings = reference.all_settings()
    assert len(settings) > 150
    missing = [s.key for s in settings if not s.description]
    assert not missing, f"settings without a description (a docstring's Attributes, or one after the field): {missing}"


def test_every_cli_argument_has_help() -> None:
    """Every argument of every ``vigil`` command (nested ones too) has a ``help=``."""
    flags = reference.all_flags()
    assert {f.command for f in flags} >= {"vigil up", "vigil sql", "vigil canary run", "vigil shards which"}
    missing = [f"{f.command} {f.flags}" for f in flags if not f.description]
    assert not missing, f"CLI arguments without help=: {missing}"


def test_every_sql_column_has_a_comment() -> None:
    """Every column of every table ``schema.sql`` creates has a ``COMMENT ON COLUMN``."""
    columns = reference.sql_columns()
    assert {c.table for c in columns} >= {"runs", "steps", "events", "anomalies", "ingest_offsets"}
    missing = [f"{c.table}.{c.name}" for c in columns if not c.description]
    assert not missing, f"columns without COMMENT ON COLUMN in daemon/store/schema.sql: {missing}"


def test_every_reference_page_is_generated_whole() -> None:
    """Each page builds from the code and names what it documents; nothing is marked undocumented."""
    pages = reference.pages()
    assert set(pages) == {f"reference/{n}.md" for n in ("settings", "cli", "sql", "detectors", "wire")}
    for path, text in pages.items():
        assert "**undocumented**" not in text, path
    from trainvigil.daemon import detectors

    for detector in detectors.REGISTRY:
        assert f"## `{detector.name}`" in pages["reference/detectors.md"]
    assert "`VIGIL_STREAM_MAX_AGE_S`" in pages["reference/settings.md"]
    assert "## `vigil up`" in pages["reference/cli.md"]


def test_the_sql_recipes_bind_against_the_schema() -> None:
    """Every SQL block of the docs binds (tables, columns, functions) on an empty history file."""
    from trainvigil.daemon.store.schema import SCHEMA_SQL

    con = duckdb.connect()
    con.execute(SCHEMA_SQL)
    recipes = blocks("sql")
    assert len(recipes) >= 10
    for block in recipes:
        try:
            con.execute(block.code).fetchall()
        except duckdb.Error as exc:
            pytest.fail(f"{block.id}: {exc}")


def test_ci_runs_the_readmes_test_command_which_builds_the_docs_strictly(tmp_path: Path) -> None:
    """``.ci/run`` ends with exactly the test command README.md gives, and that command (tests/run.py) builds the
    docs strictly, runs every tier and the static checks in a full run."""
    steps = [line.strip() for line in (ROOT / ".ci/run").read_text().splitlines() if line.strip()]
    steps = [s for s in steps if not s.startswith("#")]
    readme_commands = [b.code.strip() for b in blocks("bash") if b.path.name == "README.md"]
    assert steps[-1] in readme_commands, f".ci/run ends with {steps[-1]!r}, which README.md does not give"
    assert steps[-1] == "python tests/run.py"
    spec = importlib.util.spec_from_file_location("run_checks", ROOT / "tests" / "run.py")
    assert spec is not None and spec.loader is not None
    runner = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = runner  # before it runs: its dataclasses look their module up there
    spec.loader.exec_module(runner)
    commands = [" ".join(step.command) for step in runner.steps([], tmp_path)]
    assert any("-m mkdocs build --strict" in c for c in commands), commands
    assert any("-m pytest" in c and c.endswith("tests/static") for c in commands), commands
    parallel = [c for c in commands if "not serial" in c]
    assert len(parallel) == 1 and parallel[0].endswith("tests/unit tests/integration tests/e2e"), commands
    assert any("-m serial" in c and c.endswith("tests/unit tests/integration tests/e2e") for c in commands), commands


def test_the_readme_is_a_front_door() -> None:
    """README.md is short, and links only inside the repository."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    for target in re.findall(r"\]\(([^)#]+)", text):
        if not target.startswith("https://"):
            assert (ROOT / target).exists(), f"README.md links to {target}, which is not in the repository"


def test_the_readme_names_every_registered_detector_once() -> None:
    """README.md's one line per detector stays the registry: a detector added or renamed shows there."""
    from trainvigil.daemon import detectors

    text = (ROOT / "README.md").read_text()
    listed = re.findall(r"^\| `(\w+)` \|", text, re.M)
    assert sorted(listed) == sorted(d.name for d in detectors.REGISTRY)


def _tracked() -> list[Path]:
    """The files git tracks, and new ones it does not ignore; not this file, which holds the pattern's examples."""
    command = ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"]
    listed = subprocess.run(command, cwd=ROOT, capture_output=True, check=True).stdout
    here = Path(__file__).resolve()
    return [ROOT / name for name in dict.fromkeys(listed.decode().split("\0")) if name and ROOT / name != here]


def test_project_files_speak_of_the_project_alone() -> None:
    """No tracked file numbers the work sessions or issues it came from (history lives in git and CHANGELOG.md)."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: no tracked files to read")
    found = []
    for path in _tracked():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue  # binary files; a file deleted in the work tree
        for number, line in enumerate(text.splitlines(), 1):
            if PROCESS_WORDS.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}")
    assert not found, "process talk in project files:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "line",
    [
        "Stop 43, a VM at normal speed",
        "(since stop 37)",
        "at stops 33-34",
        "a clean-clone CI run missed it",
        "The issue's reproduction",
        "issue 12's budget",
        "numbered work sessions",
    ],
)
def test_the_process_words_pattern_catches(line: str) -> None:
    assert PROCESS_WORDS.search(line)


@pytest.mark.parametrize(
    "line",
    [
        "SIGTERM drains and commits, then stops 3 s later",
        "the probe backs off to 20 ms",
        "a non-stop 24/7 job",
        "its group is killed; the issue is the broker",
        "session, storage and catalog statements",
    ],
)
def test_the_process_words_pattern_spares(line: str) -> None:
    assert not PROCESS_WORDS.search(line)
