"""Every Python block of README.md and docs/**/*.md passes ``mypy --strict`` as printed.

The blocks of a page run in one namespace, in order (tests/readme.py); they are checked the same
way: one module per page, its blocks in order inside one ``async def`` (top-level ``await``
works there, as in the runner and in ``python -m asyncio``), whose parameters are the names the
runner binds before the first block, with their types:

    async def _page(client: AsyncSearchClient, job_id: str, job_ids: list[str]) -> None:

A block that is a file of the page's small pytest project (its first line ``# conftest.py``)
is checked as that file, beside the other files of the page's project. Blocks the runner skips
here are checked too: the Ray guide's (``ray`` and ``pyarrow`` have no types: the project's mypy
settings take them as ``Any``, so the block is checked for everything but Ray's own calls) and
the OpenTelemetry SDK's (the SDK is in the test extra). ``from __future__`` lines go to the top of
the module. The project's mypy settings apply (pyproject.toml). New pages are picked up.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.helpers import TIME_SCALE

pytest.importorskip("mypy", reason="the typing tests run mypy (in the test extra)")

ROOT = Path(__file__).resolve().parent.parent
PAGES = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md"))]
_BLOCK = re.compile(r"^```python\n(.*?)^```$", re.S | re.M)
_FILE = re.compile(r"#\s*([\w./-]+\.py)\s*\n")
_PRELUDE = """\
from asyncsearch import AsyncSearchClient


async def _page(client: AsyncSearchClient, job_id: str, job_ids: list[str]) -> None:
"""

pytestmark = pytest.mark.timeout(600)


@dataclass
class Checked:
    """The files made of one page, and where each of their lines comes from."""

    page: str
    #: file (relative to the check's folder) -> [(first line in the file, first line in the page)]
    origins: dict[str, list[tuple[int, int]]] = field(default_factory=dict)


def _module_name(page: str) -> str:
    return "page_" + re.sub(r"\W", "_", page.removesuffix(".md"))


def write_page(page: str, out: Path) -> Checked:
    """Write ``page``'s blocks as the module (and project files) mypy checks."""
    text = (ROOT / page).read_text(encoding="utf-8")
    checked = Checked(page)
    body: list[str] = []
    future: list[str] = []
    body_origins: list[tuple[int, int]] = []
    prelude_lines = _PRELUDE.count("\n")
    for match in _BLOCK.finditer(text):
        source = match.group(1)
        first_line = text[: match.start(1)].count("\n") + 1
        named = _FILE.match(source)
        if named is not None:
            name = f"{_module_name(page)}_project/{named.group(1)}"
            (out / name).parent.mkdir(parents=True, exist_ok=True)
            (out / name).write_text(source, encoding="utf-8")
            checked.origins[name] = [(1, first_line)]
            continue
        lines = source.splitlines()
        future += [line for line in lines if line.startswith("from __future__")]
        lines = ["" if line.startswith("from __future__") else line for line in lines]
        body_origins.append((prelude_lines + len(body) + 1, first_line))
        body += [textwrap.indent(line, "    ") if line else "" for line in lines]
    if not body:
        return checked
    name = f"{_module_name(page)}.py"
    # __future__ imports first, on one line each, with the prelude's lines shifted by them.
    shift = len(set(future))
    header = "".join(f"{line}\n" for line in dict.fromkeys(future))
    (out / name).write_text(header + _PRELUDE + "\n".join(body) + "\n", encoding="utf-8")
    checked.origins[name] = [(start + shift, line) for start, line in body_origins]
    return checked


def where(checked: Checked, file: str, line: int) -> str:
    """``page:line`` of a line of a file written for the page."""
    starts = [(start, page_line) for start, page_line in checked.origins[file] if start <= line]
    if not starts:
        return f"{checked.page} (the prelude)"
    start, page_line = starts[-1]
    return f"{checked.page}:{page_line + line - start}"


def run_mypy(folder: Path, files: list[str], cache: Path) -> str:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--strict",
            "--cache-dir",
            str(cache),
            "--no-error-summary",
            "--show-error-codes",
            *files,
        ],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=300 * TIME_SCALE,
        check=False,
    )
    assert result.returncode in (0, 1), result.stdout + result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def mypy_errors(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """Per page, mypy's errors, each located at its page's line."""
    out = tmp_path_factory.mktemp("docs-typing")
    cache = tmp_path_factory.mktemp("mypy-cache")
    pages = {page: write_page(page, out) for page in PAGES}
    by_file = {file: checked for checked in pages.values() for file in checked.origins}
    # The pages' modules in one run; each pytest project in its own folder (its files import
    # each other by their plain names, as pytest runs them there).
    runs = [(out, sorted(f for f in by_file if "/" not in f))]
    projects = sorted({f.split("/")[0] for f in by_file if "/" in f})
    runs += [
        (out / p, sorted(f.split("/", 1)[1] for f in by_file if f.startswith(p + "/")))
        for p in projects
    ]
    errors: dict[str, list[str]] = {page: [] for page in PAGES}
    for folder, files in runs:
        if not files:
            continue
        prefix = "" if folder == out else folder.name + "/"
        for line in run_mypy(folder, files, cache).splitlines():
            found = re.match(r"^(.+?):(\d+): (error|note): (.*)$", line)
            assert found is not None, line
            file, number, kind, message = found.groups()
            checked = by_file[prefix + file]
            if kind == "error":
                errors[checked.page].append(
                    f"{where(checked, prefix + file, int(number))}: {message}"
                )
    return errors


@pytest.mark.parametrize("page", PAGES)
def test_every_python_block_passes_mypy_strict(
    page: str, mypy_errors: dict[str, list[str]]
) -> None:
    assert mypy_errors[page] == [], "\n".join(mypy_errors[page])
