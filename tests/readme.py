"""Runs the code blocks of README.md and docs/**/*.md against the bundled emulator.

The convention the blocks assume is stated in docs/getting-started.md ("Examples in these
docs"): one emulator and one client per page, shared by every block of that page, in a scratch
working directory. sybil parses the blocks and evaluates them; each page is one test
(``tests/test_readme.py``), so that random order and parallel workers never separate blocks
that build on each other.

- ``python`` blocks run in one namespace, in order, with top-level ``await`` allowed (as in
  ``python -m asyncio``) and ``__name__ == "__main__"``. Names bound before the first block:
  ``client`` (an open ``AsyncSearchClient`` pointed at the emulator), ``job_id`` (a finished job
  with webhook logs) and ``job_ids`` (every seeded job id). The emulator and the client live on
  an event loop in a background thread, so a block may also call ``asyncio.run`` itself.
- A ``python`` or ``toml`` block whose first line is ``# NAME`` (``# conftest.py``) is a file
  of a small pytest project instead (one per page); the block holding a ``test_*.py`` file runs
  that file with ``python -m pytest`` in a subprocess, which must pass.
- Every other ``python`` block must run as pasted into ``python -m asyncio`` (``repl_problem``):
  in the README after its ``REPL_HEADING``, in docs/ everywhere except a complete script (one
  with a top-level ``asyncio.run(...)`` line).
- ``sh`` blocks run with ``bash -e``, with ``ASYNCSEARCH_API_KEY`` and ``ASYNCSEARCH_BASE_URL``
  pointing at the emulator, ``$JOB_ID``, ``$LOG_ID`` and ``$RESOURCE_ID`` set, and the
  ``asyncsearch`` command of this environment first on ``PATH``. Every command must exit 0.
- The working directory holds ``photo.jpg`` (a small JPEG) and ``job_ids.txt`` (one job id per
  line).
- ``<!-- skip: next ... -->`` in the page's source skips the next block, with its reason.
"""

from __future__ import annotations

import ast
import asyncio
import codeop
import contextlib
import importlib.util
import inspect
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from sybil import Example, Sybil
from sybil.evaluators.python import pad
from sybil.example import SybilFailure
from sybil.parsers.markdown import CodeBlockParser, SkipParser

from asyncsearch import AsyncSearchClient
from asyncsearch.testing import ServiceEmulator
from tests.helpers import TIME_SCALE

#: Bound on one block (a pytest project's test file, run in a subprocess, included), scaled like
#: every liveness bound of the suite (tests/helpers.py); pytest-timeout bounds each page.
BLOCK_TIMEOUT = 50.0 * TIME_SCALE
README_KEY = "readme-key"
README_SEED = 7
_FILE_RE = re.compile(r"#\s*([\w./-]+\.(?:py|toml))\s*\n")
_SMALL_JPEG = b"\xff\xd8\xff\xe0\x00\x10JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00" + b"\x00" * 64


class Readme:
    """The emulator, client, scratch directory and environment of one page's run."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(
            target=self.loop.run_forever, name="asyncsearch.readme.loop", daemon=True
        )
        self.workdir = Path(tempfile.mkdtemp(prefix="asyncsearch-readme-"))
        self.project = self.workdir / "pytest-project"
        self.emulator: ServiceEmulator | None = None
        self.client: AsyncSearchClient | None = None
        self._saved_env: dict[str, str | None] = {}
        self._saved_cwd = os.getcwd()

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> dict[str, Any]:
        """Start everything; return the names bound for the blocks."""
        self.thread.start()
        self.run(self._open())
        emulator = self.emulator
        assert emulator is not None
        jobs = emulator.jobs()
        job_id = next(
            job["id"] for job in jobs if job["state"] == "done" and emulator.webhook_logs(job["id"])
        )
        self.job_id = job_id
        self.log_id = emulator.webhook_logs(job_id)[0]["id"]
        self.resource_id = emulator.resources()[0]["id"]
        (self.workdir / "photo.jpg").write_bytes(_SMALL_JPEG)
        (self.workdir / "job_ids.txt").write_text("".join(job["id"] + "\n" for job in jobs))
        self.project.mkdir()
        self._set_env(
            ASYNCSEARCH_API_KEY=emulator.api_key,
            ASYNCSEARCH_BASE_URL=emulator.base_url,
            # The Ray block's workers at a fair share of a busy machine (see the Ray guide's
            # section and tests/test_ray.py's ray_session).
            RAY_worker_niceness="0",
        )
        os.chdir(self.workdir)
        return {
            "client": self.client,
            "job_id": job_id,
            "job_ids": [job["id"] for job in jobs],
            "__name__": "__main__",
            # For `<!-- skip: next if(...) -->` of blocks that need an optional package.
            "ray_installed": importlib.util.find_spec("ray") is not None,
        }

    async def _open(self) -> None:
        self.emulator = ServiceEmulator(api_key=README_KEY, seed=README_SEED)
        await self.emulator.start()
        self.client = AsyncSearchClient(
            api_key=self.emulator.api_key, base_url=self.emulator.base_url
        )

    async def _close(self) -> None:
        try:
            if self.client is not None:
                await self.client.aclose()
        finally:
            if self.emulator is not None:
                await self.emulator.stop()

    def stop(self) -> None:
        os.chdir(self._saved_cwd)
        for name, value in self._saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        try:
            if self.thread.is_alive():
                self.run(self._close())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=10)
            self.loop.close()
            shutil.rmtree(self.workdir, ignore_errors=True)

    def _set_env(self, **values: str) -> None:
        for name, value in values.items():
            self._saved_env.setdefault(name, os.environ.get(name))
            os.environ[name] = value

    # -- running blocks --------------------------------------------------------------------

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run ``coro`` on the page's loop (in its thread) and wait for it, bounded."""

        async def bounded() -> Any:
            async with asyncio.timeout(BLOCK_TIMEOUT):
                return await coro

        future: Future[Any] = asyncio.run_coroutine_threadsafe(bounded(), self.loop)
        return future.result(timeout=BLOCK_TIMEOUT + 5)

    def write_file(self, name: str, source: str) -> None:
        path = self.project / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)

    def run_pytest_project(self, test_file: str) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test_file],
            cwd=self.project,
            env=env,
            capture_output=True,
            text=True,
            timeout=BLOCK_TIMEOUT,
            check=False,
        )
        assert result.returncode == 0, result.stdout + result.stderr

    def shell_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["JOB_ID"] = self.job_id
        env["LOG_ID"] = self.log_id
        env["RESOURCE_ID"] = self.resource_id
        env["PATH"] = os.pathsep.join((str(Path(sys.executable).parent), env.get("PATH", "")))
        env["COLUMNS"] = "100"
        return env


def _readme(example: Example) -> Readme:
    readme = example.namespace["__readme__"]
    assert isinstance(readme, Readme)
    return readme


#: The README's promise: every block after this heading runs as pasted into `python -m asyncio`.
REPL_HEADING = "## A short tour"


def repl_problem(source: str) -> str | None:
    """Why ``source`` fails pasted line by line into ``python -m asyncio``, or None.

    Fed to the compiler the asyncio REPL uses (``code.InteractiveConsole`` with top-level
    ``await``), one line at a time: a compound statement ends only at a blank line there, so
    code right after one is a syntax error, and a blank line inside a function ends it. And
    ``asyncio.run()`` raises there, since a loop is already running.
    """
    compiler = codeop.CommandCompiler()
    compiler.compiler.flags |= ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    buffer: list[str] = []
    for number, line in enumerate([*source.splitlines(), ""], 1):
        buffer.append(line)
        try:
            complete = compiler("\n".join(buffer), "<stdin>", "single")
        except SyntaxError as exc:
            return f"line {number} of the block: {exc.msg} (as pasted into python -m asyncio)"
        if complete is not None:
            buffer.clear()
    if re.search(r"^asyncio\.run\(", source, re.M):
        return "asyncio.run() raises in python -m asyncio, where a loop runs: use await"
    return None


def _pasted_into_the_repl(example: Example, source: str) -> bool:
    """Whether the block must run as pasted into ``python -m asyncio`` (see the docstring)."""
    if Path(example.path).name == "README.md":
        text = Path(example.path).read_text(encoding="utf-8")
        heading = text.split(REPL_HEADING, 1)[0].count("\n") + 1
        return example.line > heading
    return re.search(r"^asyncio\.run\(", source, re.M) is None


def evaluate_python(example: Example) -> None:
    """Run a ``python`` block, awaiting it on the page's loop if it uses top-level await."""
    source = str(example.parsed)
    readme = _readme(example)
    file = _FILE_RE.match(source)
    if file is not None:
        readme.write_file(file.group(1), source)
        if Path(file.group(1)).name.startswith("test_"):
            readme.run_pytest_project(file.group(1))
        return
    if _pasted_into_the_repl(example, source):
        problem = repl_problem(source)
        assert problem is None, problem
    code = compile(
        pad(source, example.line + example.parsed.line_offset),
        example.path,
        "exec",
        flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT,
        dont_inherit=True,
    )
    if code.co_flags & inspect.CO_COROUTINE:
        readme.run(eval(code, example.namespace))
    else:
        exec(code, example.namespace)


def evaluate_file(example: Example) -> None:
    """A ``toml`` block: a file of the page's small pytest project (its first line names it)."""
    source = str(example.parsed)
    file = _FILE_RE.match(source)
    assert file is not None, "a toml block starts with '# NAME.toml'"
    _readme(example).write_file(file.group(1), source)


def evaluate_shell(example: Example) -> None:
    """Run an ``sh`` block with ``bash -e`` against the emulator; every command must succeed.

    The block runs in a process group of its own, ended when the block ends (or times out), so
    that nothing it started, such as a server in the background, outlives it.
    """
    readme = _readme(example)
    process = subprocess.Popen(
        ["bash", "-e", "-c", str(example.parsed)],
        cwd=readme.workdir,
        env=readme.shell_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=BLOCK_TIMEOUT)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        if process.returncode is None:
            process.communicate()
    assert process.returncode == 0, (
        f"exit {process.returncode}\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
    )


def _reporting(evaluator: Callable[[Example], None]) -> Callable[[Example], None]:
    """Report a failing block with its whole traceback (sybil's filter cuts it to nothing)."""

    def evaluate(example: Example) -> None:
        try:
            evaluator(example)
        except Exception:
            raise SybilFailure(example, traceback.format_exc()) from None

    evaluate.__name__ = evaluator.__name__
    return evaluate


def _shut_down_ray() -> None:
    """The Ray guide's block starts and stops a local Ray of its own: none may run around it
    (tests/test_ray.py keeps one between its tests), and a failing block must not leave one."""
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()


def _setup(namespace: dict[str, Any]) -> None:
    _shut_down_ray()
    readme = Readme()
    namespace["__readme__"] = readme
    try:
        namespace.update(readme.start())
    except BaseException:
        readme.stop()
        raise


def _teardown(namespace: dict[str, Any]) -> None:
    readme = namespace.get("__readme__")
    try:
        _shut_down_ray()
        # A page's block may bind a client of its own, as a reader pasting it would.
        client = namespace.get("client")
        if (
            isinstance(readme, Readme)
            and isinstance(client, AsyncSearchClient)
            and client is not readme.client
            and readme.thread.is_alive()
        ):
            readme.run(client.aclose())
    finally:
        if isinstance(readme, Readme):
            readme.stop()


readme_sybil = Sybil(
    parsers=[
        SkipParser(),
        CodeBlockParser(language="python", evaluator=_reporting(evaluate_python)),
        CodeBlockParser(language="toml", evaluator=_reporting(evaluate_file)),
        CodeBlockParser(language="sh", evaluator=_reporting(evaluate_shell)),
    ],
    patterns=["README.md", "docs/**/*.md"],
    path=str(Path(__file__).resolve().parent.parent),
    setup=_setup,
    teardown=_teardown,
    name="readme",
)
