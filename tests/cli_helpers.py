"""Running the real ``asyncsearch`` command in a subprocess, for the CLI tests."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncsearch
from asyncsearch.testing import ServiceEmulator

from .helpers import TIME_SCALE

REPO_ROOT = Path(asyncsearch.__file__).resolve().parent.parent
TEST_KEY = "test-key"
#: Bound on one command run; each test is also bounded by pytest-timeout (60 s).
RUN_TIMEOUT = 30.0 * TIME_SCALE


@dataclass
class Completed:
    """A finished command: exit status and what it printed."""

    code: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def cli_env(emu: ServiceEmulator | None = None, **extra: str) -> dict[str, str]:
    """The environment of a command: no ASYNCSEARCH_* of the caller, pointed at ``emu`` if given."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASYNCSEARCH_")}
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p
    )
    # rich lays tables out for 80 columns when not on a terminal, unless COLUMNS says otherwise;
    # fixed here so the caller's terminal cannot change what the tests see.
    env["COLUMNS"] = "100"
    env["PYTHONIOENCODING"] = "utf-8"
    # asyncio's debug mode (CI sets it) reports slow callbacks on stderr, which on a busy machine
    # would land in the output under test.
    env.pop("PYTHONASYNCIODEBUG", None)
    env.pop("FORCE_COLOR", None)
    env.pop("TTY_COMPATIBLE", None)
    if emu is not None:
        env["ASYNCSEARCH_API_KEY"] = emu.api_key
        env["ASYNCSEARCH_BASE_URL"] = emu.base_url
    env.update(extra)
    return env


async def start_cli(
    *args: str, env: dict[str, str], stdin: int | None = asyncio.subprocess.DEVNULL
) -> asyncio.subprocess.Process:
    """Start ``python -m asyncsearch ARGS`` with pipes for stdout and stderr."""
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "asyncsearch",
        *args,
        env=env,
        stdin=stdin,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def finish(
    process: asyncio.subprocess.Process, *, input: bytes | None = None, timeout: float = RUN_TIMEOUT
) -> Completed:
    """Wait for a started command (killing it past ``timeout``) and collect its output."""
    try:
        async with asyncio.timeout(timeout):
            stdout, stderr = await process.communicate(input)
    except BaseException:
        if process.returncode is None:
            process.kill()
        await process.wait()
        raise
    assert process.returncode is not None
    return Completed(process.returncode, stdout.decode(), stderr.decode())


async def run_cli(
    *args: str, env: dict[str, str], input: bytes | None = None, timeout: float = RUN_TIMEOUT
) -> Completed:
    """Run ``python -m asyncsearch ARGS`` to completion."""
    stdin = asyncio.subprocess.PIPE if input is not None else asyncio.subprocess.DEVNULL
    process = await start_cli(*args, env=env, stdin=stdin)
    return await finish(process, input=input, timeout=timeout)


async def run_python(code: str, *, env: dict[str, str]) -> Completed:
    """Run ``python -c CODE``."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        code,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    return await finish(process)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every line of a JSON Lines file, decoded; fails on a line that does not parse."""
    data = path.read_bytes()
    assert data == b"" or data.endswith(b"\n"), "the file does not end with a newline"
    return [json.loads(line) for line in data.splitlines()]


def extract_fetches(emu: ServiceEmulator) -> Counter[str]:
    """How many times the emulator was asked for each extraction job."""
    return Counter(
        request.path.rsplit("/", 1)[1] for request in emu.requests if request.endpoint == "extract"
    )


async def read_stderr_until(process: asyncio.subprocess.Process, marker: bytes) -> str:
    """Read a started command's stderr up to a line holding ``marker``; return what was read."""
    assert process.stderr is not None
    seen = b""
    async with asyncio.timeout(RUN_TIMEOUT):
        while marker not in seen:
            line = await process.stderr.readline()
            assert line, f"stderr ended before {marker!r}: {seen.decode()!r}"
            seen += line
    return seen.decode()
