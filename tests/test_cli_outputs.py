"""The one rule for every file a command writes, empty options, messages and progress.

No command writes over a file it did not make: an existing regular file is only ever resumed
when the command recognises it as its own export, else refused (exit 2) and left as it is;
``--force`` replaces it. ``-``, a pipe and ``/dev/null`` are not files to protect.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from asyncsearch.testing import ServiceEmulator

from .cli_helpers import (
    RUN_TIMEOUT,
    TEST_KEY,
    cli_env,
    extract_fetches,
    finish,
    read_jsonl,
    read_stderr_until,
    run_cli,
    start_cli,
)

pytestmark = pytest.mark.timeout(120)

pa = pytest.importorskip("pyarrow", reason="--parquet needs pyarrow (the arrow extra)")
pq = pytest.importorskip("pyarrow.parquet", reason="--parquet needs pyarrow (the arrow extra)")


@pytest_asyncio.fixture
async def emu() -> AsyncIterator[ServiceEmulator]:
    async with ServiceEmulator(api_key=TEST_KEY, seed=3, n_resources=30, n_jobs=12) as e:
        yield e


def _ids_file(emu: ServiceEmulator, tmp_path: Path, n: int = 3) -> Path:
    ids_file = tmp_path / "ids.txt"
    ids_file.write_text("".join(job["id"] + "\n" for job in emu.jobs()[:n]))
    return ids_file


async def _exports(emu: ServiceEmulator, tmp_path: Path) -> dict[str, Path]:
    """Files a user may have beside a search: each of them must survive ``search --parquet``."""
    ids_file = _ids_file(emu, tmp_path)
    jsonl = tmp_path / "export.jsonl"
    done = await run_cli("extract-many", str(ids_file), "-o", str(jsonl), env=cli_env(emu))
    assert done.code == 0, done.stderr
    parquet = tmp_path / "export.parquet"
    done = await run_cli("extract-many", str(ids_file), "--parquet", str(parquet), env=cli_env(emu))
    assert done.code == 0, done.stderr
    text = tmp_path / "notes.txt"
    text.write_text("my notes\n")
    return {"ids": ids_file, "jsonl": jsonl, "parquet": parquet, "text": text}


# -- the rule ---------------------------------------------------------------------------------


async def test_search_parquet_refuses_every_existing_file_and_force_replaces_it(
    emu: ServiceEmulator, tmp_path: Path
) -> None:
    files = await _exports(emu, tmp_path)
    before = {name: path.read_bytes() for name, path in files.items()}
    for name, path in files.items():
        result = await run_cli("search", "invoice", "--parquet", str(path), env=cli_env(emu))
        assert result.code == 2, (name, result.stderr)
        assert f"{path} (--parquet)" in result.stderr
        assert "--force" in result.stderr
        assert path.read_bytes() == before[name], name
        assert f"{path}.partial" not in result.stderr
    target = files["text"]
    forced = await run_cli(
        "search", "--max-items", "5", "--parquet", str(target), "--force",
        env=cli_env(emu),
    )  # fmt: skip
    assert forced.code == 0, forced.stderr
    assert pq.read_table(target).num_rows == 5


async def test_search_parquet_onto_a_pipe_is_refused_not_renamed_over(
    emu: ServiceEmulator, tmp_path: Path
) -> None:
    # Parquet is written aside and renamed into place: over a pipe (or /dev/null) that would
    # replace the pipe itself with a file.
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    result = await run_cli("search", "invoice", "--parquet", str(fifo), "--force", env=cli_env(emu))
    assert result.code == 2, result.stderr
    assert "not a regular file" in result.stderr
    assert fifo.is_fifo()


@pytest.mark.parametrize(
    "content",
    [
        b'{"level": "info", "msg": "started"}\n{"level": "warn", "msg": "slow"}\n',
        b'{"debug": true}\n',
        b'{"jobId": "0d7c", "note": "no ok field"}\n',
    ],
    ids=["an app log", "a one-line config", "no ok"],
)
async def test_extract_many_refuses_json_lines_that_are_not_its_export(
    emu: ServiceEmulator, tmp_path: Path, content: bytes
) -> None:
    ids_file = _ids_file(emu, tmp_path)
    log = tmp_path / "app.log.jsonl"
    log.write_bytes(content)
    result = await run_cli("extract-many", str(ids_file), "-o", str(log), env=cli_env(emu))
    assert result.code == 2, result.stderr
    assert f"{log} (--output)" in result.stderr
    assert "not an export of extract-many" in result.stderr
    assert "did not parse" not in result.stderr
    assert log.read_bytes() == content
    assert emu.stats.count() == 0


async def test_extract_many_force_starts_the_export_anew(
    emu: ServiceEmulator, tmp_path: Path
) -> None:
    ids_file = _ids_file(emu, tmp_path, n=2)
    log = tmp_path / "app.log.jsonl"
    log.write_bytes(b'{"debug": true}\n')
    result = await run_cli(
        "extract-many", str(ids_file), "-o", str(log), "--force", env=cli_env(emu)
    )
    assert result.code == 0, result.stderr
    assert [line["ok"] for line in read_jsonl(log)] == [True, True]
    parquet = tmp_path / "notes.parquet"
    parquet.write_bytes(b"not parquet")
    result = await run_cli(
        "extract-many", str(ids_file), "--parquet", str(parquet), "--force", env=cli_env(emu)
    )
    assert result.code == 0, result.stderr
    assert pq.read_table(parquet).num_rows == 2


async def test_a_foreign_line_in_an_export_is_not_said_not_to_parse(
    emu: ServiceEmulator, tmp_path: Path
) -> None:
    ids_file = _ids_file(emu, tmp_path, n=1)
    out = tmp_path / "out.jsonl"
    first = await run_cli("extract-many", str(ids_file), "-o", str(out), env=cli_env(emu))
    assert first.code == 0, first.stderr
    with out.open("ab") as handle:
        handle.write(b'{"comment": "added by hand"}\n')
    again = await run_cli("extract-many", str(ids_file), "-o", str(out), env=cli_env(emu))
    assert again.code == 0, again.stderr
    assert "1 line of" in again.stderr
    assert "did not parse" not in again.stderr
    assert "not a line of extract-many" in again.stderr


async def test_serve_write_ids_refuses_an_existing_file_and_force_replaces_it(
    tmp_path: Path,
) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("keep me\n")
    refused = await run_cli("serve", "--port", "0", "--write-ids", str(notes), env=cli_env())
    assert refused.code == 2, refused.stderr
    assert f"{notes} (--write-ids)" in refused.stderr
    assert "--force" in refused.stderr
    assert notes.read_text() == "keep me\n"
    process = await start_cli(
        "serve", "--port", "0", "--jobs", "2", "--write-ids", str(notes), "--force", env=cli_env()
    )
    try:
        assert process.stdout is not None
        async with asyncio.timeout(RUN_TIMEOUT):
            while b"Press Ctrl-C" not in await process.stdout.readline():
                pass
    finally:
        if process.returncode is None:
            process.send_signal(2)
        served = await finish(process)
    assert served.code == 0, served.stderr
    assert len(notes.read_text().splitlines()) == 2


# -- empty options and messages ---------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["--api-key", "", "search", "x"],
        ["search", "x", "--api-key", ""],
        ["--base-url", "", "search", "x"],
        ["--base-id", "", "search", "x"],
        ["search", "x", "--parquet", ""],
        ["search", "--image", ""],
        ["extract-many", "ids.txt", "-o", ""],
        ["serve", "--api-key", ""],
        ["serve", "--write-ids", ""],
    ],
    ids=lambda args: " ".join(a or repr(a) for a in args),
)
async def test_an_empty_option_value_is_a_usage_error(
    emu: ServiceEmulator, tmp_path: Path, args: list[str]
) -> None:
    result = await run_cli(*args, env=cli_env(emu))
    assert result.code == 2, result.stderr
    assert "must not be empty" in result.stderr
    assert emu.stats.count() == 0


@pytest.mark.skipif(not Path("/proc/version").is_file(), reason="needs Linux's /proc/version")
async def test_an_output_that_exists_is_never_said_to_be_missing(emu: ServiceEmulator) -> None:
    refused = await run_cli("search", "x", "--parquet", "/proc/version", env=cli_env(emu))
    assert refused.code == 2, refused.stderr
    assert "No such file" not in refused.stderr
    assert "exists" in refused.stderr
    # Forced, the real reason: the file beside it, written first, cannot be made there.
    forced = await run_cli("search", "x", "--parquet", "/proc/version", "--force", env=cli_env(emu))
    assert forced.code == 2, forced.stderr
    assert "/proc/version.partial" in forced.stderr


async def test_stdin_and_stdout_both_dev_null_are_not_a_loop(emu: ServiceEmulator) -> None:
    # Both are the same character device, never a regular file: nothing to read back.
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "asyncsearch", "extract-many", "-", "-o", "-",
        env=cli_env(emu), stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    async with asyncio.timeout(RUN_TIMEOUT):
        _, stderr = await process.communicate()
    assert process.returncode == 0, stderr
    assert b"0 ids" in stderr


# -- progress without a terminal --------------------------------------------------------------


async def test_progress_lines_without_a_terminal_and_none_with_quiet(
    emu: ServiceEmulator, tmp_path: Path
) -> None:
    """Both runs are held at the gate; the plain one's first progress line comes one interval
    after it started, which is after the quiet one started: by then the quiet one would have
    printed too, and its stderr is read whole once it ends."""
    ids_file = _ids_file(emu, tmp_path, n=3)
    emu.faults.hold("extract", after=1)
    quiet = await start_cli(
        "extract-many", str(ids_file), "-o", str(tmp_path / "q.jsonl"), "--quiet",
        "--concurrency", "1", env=cli_env(emu),
    )  # fmt: skip
    plain: asyncio.subprocess.Process | None = None
    try:
        async with asyncio.timeout(RUN_TIMEOUT):
            await emu.faults.wait_parked(1, "extract")
        plain = await start_cli(
            "extract-many", str(ids_file), "-o", str(tmp_path / "p.jsonl"),
            "--concurrency", "1", env=cli_env(emu),
        )  # fmt: skip
        async with asyncio.timeout(RUN_TIMEOUT):
            await emu.faults.wait_parked(2, "extract")
        seen = await read_stderr_until(plain, b"fetched so far")
        assert "extract-many: 0 of 3 fetched so far" in seen or "1 of 3" in seen, seen
    finally:
        emu.faults.release("extract")
        quiet_done = await finish(quiet)
        plain_done = await finish(plain) if plain is not None else None
    assert quiet_done.code == 0, quiet_done.stderr
    assert "so far" not in quiet_done.stderr
    assert "extract-many: 3 ids, 3 ok" in quiet_done.stderr  # the summary is still printed
    assert plain_done is not None
    assert plain_done.code == 0, plain_done.stderr


# -- a core message: an exception without a message is named alone (_transport._translate) --


async def test_a_timeout_message_has_no_empty_cause(tmp_path: Path) -> None:
    async with ServiceEmulator(api_key=TEST_KEY, seed=3, n_resources=5, n_jobs=1) as e:
        e.faults.hold("extract")
        job = e.jobs()[0]["id"]
        result = await run_cli(
            "extract", job, "--timeout", "0.2", "--max-retries", "0", env=cli_env(e)
        )
        e.faults.release("extract")
    assert result.code == 1, result.stderr
    assert "total timeout" in result.stderr
    # An empty cause: "TimeoutError: " then the end of the line, a bracket or "(after 2 attempts)".
    assert not re.search(r"TimeoutError: *($|[()])", result.stderr, re.MULTILINE), result.stderr


def test_the_rule_lives_in_one_place() -> None:
    """Every output flag of every command goes through ``_outputs.check_output``."""
    root = Path(__file__).resolve().parent.parent / "asyncsearch" / "_cli"
    callers = {
        path.name
        for path in root.glob("*.py")
        if "check_output(" in path.read_text() and path.name != "_outputs.py"
    }
    assert callers == {"_commands.py", "_export.py", "_serve.py"}
    assert json.dumps(sorted(callers))  # each command module, none skipped


async def test_search_parquet_never_empties_a_file_beside_it_that_it_did_not_write(
    emu: ServiceEmulator, tmp_path: Path
) -> None:
    # FILE.partial is where search writes before renaming: a killed search's own one (Parquet,
    # or empty) is taken over; anything else is somebody's file.
    target = tmp_path / "hits.parquet"
    aside = tmp_path / "hits.parquet.partial"
    aside.write_text("my notes\n")
    result = await run_cli("search", "--parquet", str(target), env=cli_env(emu))
    assert result.code == 2, result.stderr
    assert f"{aside}" in result.stderr
    assert aside.read_text() == "my notes\n"
    assert not target.exists()
    assert emu.stats.count() == 0


async def test_extract_many_writes_into_a_named_pipe(emu: ServiceEmulator, tmp_path: Path) -> None:
    # A pipe is an output like stdout: nothing in it to read back (reading would wait forever).
    ids_file = _ids_file(emu, tmp_path, n=2)
    fifo = tmp_path / "results.pipe"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        result = await run_cli("extract-many", str(ids_file), "-o", str(fifo), env=cli_env(emu))
        assert result.code == 0, result.stderr
        written = os.read(reader, 1 << 20)
    finally:
        os.close(reader)
    assert [json.loads(line)["ok"] for line in written.splitlines()] == [True, True]


async def test_extract_many_refuses_a_line_that_is_not_utf8_with_its_number(
    emu: ServiceEmulator, tmp_path: Path
) -> None:
    """Issue 47: the line was read as "\\ufffd\\ufffd" (its bytes lost) and sent as an id."""
    good = [job["id"] for job in emu.jobs()[:2]]
    ids_file = tmp_path / "ids.txt"
    ids_file.write_bytes(f"{good[0]}\n".encode() + b"\xff\xfe-not-utf8\n" + f"{good[1]}\n".encode())
    out = tmp_path / "out.jsonl"
    result = await run_cli("extract-many", str(ids_file), "-o", str(out), env=cli_env(emu))
    assert result.code == 1, result.stderr  # as for any failed id
    lines = read_jsonl(out)
    assert sorted(line["jobId"] for line in lines if line["ok"]) == sorted(good)
    (refused,) = [line for line in lines if not line["ok"]]
    assert refused["jobId"] == "\\xff\\xfe-not-utf8"  # the bytes, escaped, not replaced
    assert refused["error"]["type"] == "InvalidRequestError"
    assert refused["error"]["message"].startswith("line 2 of the ids is not UTF-8")
    assert "\ufffd" not in out.read_text(encoding="utf-8")
    assert sorted(extract_fetches(emu)) == sorted(good)  # never sent
    assert "1 failed" in result.stderr
    again = await run_cli("extract-many", str(ids_file), "-o", str(out), env=cli_env(emu))
    assert again.code == 1, again.stderr
    assert len(read_jsonl(out)) == 3  # a resumed run does not write it again
