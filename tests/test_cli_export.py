"""``asyncsearch extract-many``: one line per id, and resuming after an interruption."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import pytest_asyncio

from asyncsearch import ExtractionJob
from asyncsearch._cli import _export
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
from .helpers import turns

N_JOBS = 400
CONCURRENCY = 4


@pytest_asyncio.fixture
async def emu() -> AsyncIterator[ServiceEmulator]:
    async with ServiceEmulator(api_key=TEST_KEY, seed=3, n_resources=20, n_jobs=N_JOBS) as e:
        yield e


def _unknown_ids(n: int) -> list[str]:
    return [str(uuid.uuid4()) for _ in range(n)]


def _by_id(lines: list[dict[str, object]]) -> dict[object, list[dict[str, object]]]:
    found: dict[object, list[dict[str, object]]] = {}
    for line in lines:
        found.setdefault(line["jobId"], []).append(line)
    return found


def _line_count(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


async def _wait_for_lines(path: Path, count: int, timeout: float = 20.0) -> None:
    async with asyncio.timeout(timeout):
        while True:
            if _line_count(path) >= count:
                return
            await asyncio.sleep(0.01)


async def test_one_line_per_distinct_id_with_failures_reported(
    emu: ServiceEmulator, tmp_path: Path
) -> None:
    known = [job["id"] for job in emu.jobs()[:295]]
    unknown = _unknown_ids(5)
    ids_file = tmp_path / "ids.txt"
    # Comments, blank lines, CRLF endings and repeated ids, as real id lists have them.
    text = "# jobs to export\n\n" + "\r\n".join(known + unknown) + "\n  \n" + "\n".join(known[:10])
    ids_file.write_text(text)
    out = tmp_path / "out.jsonl"
    result = await run_cli("extract-many", str(ids_file), "-o", str(out), env=cli_env(emu))
    assert result.code == 1, result.stderr  # some ids failed
    assert "300 ids, 295 ok, 5 failed" in result.stderr
    assert "10 repeated ids ignored" in result.stderr
    lines = read_jsonl(out)
    by_id = _by_id(lines)
    assert len(lines) == 300
    assert set(by_id) == set(known) | set(unknown)
    for job_id in known:
        (line,) = by_id[job_id]
        assert line["ok"] is True
        job = msgspec.json.decode(msgspec.json.encode(line["job"]), type=ExtractionJob)
        wire = msgspec.json.encode(emu.job(job_id))
        assert job == msgspec.json.decode(wire, type=ExtractionJob)
    for job_id in unknown:
        (line,) = by_id[job_id]
        assert line["ok"] is False
        error = line["error"]
        assert isinstance(error, dict)
        assert error["type"] == "NotFoundError"
        assert error["status"] == 404
        assert job_id in error["message"]
    assert sorted(extract_fetches(emu).values()) == [1] * 300
    assert result.stdout == ""


@pytest.mark.parametrize(
    ("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["SIGINT", "SIGTERM"]
)
async def test_interrupted_then_resumed_fetches_each_id_once(
    emu: ServiceEmulator, tmp_path: Path, signum: int, code: int
) -> None:
    ids = [job["id"] for job in emu.jobs()]
    ids_file = tmp_path / "ids.txt"
    ids_file.write_text("\n".join(ids) + "\n")
    out = tmp_path / "out.jsonl"
    args = ("extract-many", str(ids_file), "-o", str(out), "--concurrency", str(CONCURRENCY))
    # 40 fetches pass, then every worker is parked at the gate: the run is certainly in the
    # middle when the signal comes, however slow or fast this machine is.
    emu.faults.hold("extract", after=40)
    process = await start_cli(*args, env=cli_env(emu))
    async with asyncio.timeout(RUN_TIMEOUT):
        await emu.faults.wait_parked(CONCURRENCY, "extract")
    await _wait_for_lines(out, 40)
    process.send_signal(signum)
    # Let the requests in flight go once the command says it is stopping (so no new id starts).
    head = await read_stderr_until(process, b"stopping")
    emu.faults.release()
    first = await finish(process)
    first.stderr = head + first.stderr
    assert first.code == code, first.stderr
    assert "interrupted after fetching" in first.stderr
    written = read_jsonl(out)
    assert len(written) == 40 + CONCURRENCY
    # What was in flight was written before exiting: every request made has its line.
    assert sum(extract_fetches(emu).values()) == len(written)

    emu.faults.clear()
    second = await run_cli(*args, env=cli_env(emu))
    assert second.code == 0, second.stderr
    assert f"{len(written)} already in" in second.stderr
    lines = read_jsonl(out)
    assert lines[: len(written)] == written
    assert sorted(line["jobId"] for line in lines) == sorted(ids)
    fetches = extract_fetches(emu)
    assert set(fetches) == set(ids)
    assert set(fetches.values()) == {1}


async def test_killed_then_resumed_loses_and_repeats_nothing_but_what_was_in_flight(
    emu: ServiceEmulator, tmp_path: Path
) -> None:
    ids = [job["id"] for job in emu.jobs()]
    ids_file = tmp_path / "ids.txt"
    ids_file.write_text("\n".join(ids) + "\n")
    out = tmp_path / "out.jsonl"
    args = ("extract-many", str(ids_file), "-o", str(out), "--concurrency", str(CONCURRENCY))
    # 40 fetches pass, then the workers are parked: the kill lands in the middle of the run.
    emu.faults.hold("extract", after=40)
    process = await start_cli(*args, env=cli_env(emu))
    async with asyncio.timeout(RUN_TIMEOUT):
        await emu.faults.wait_parked(CONCURRENCY, "extract")
    await _wait_for_lines(out, 40)
    process.kill()
    first = await finish(process)
    assert first.code == -signal.SIGKILL
    lines_before = out.read_bytes().count(b"\n")
    assert lines_before == 40

    emu.faults.clear()
    second = await run_cli(*args, env=cli_env(emu))
    assert second.code == 0, second.stderr
    lines = read_jsonl(out)
    assert sorted(line["jobId"] for line in lines) == sorted(ids)
    assert all(line["ok"] for line in lines)
    fetches = extract_fetches(emu)
    assert set(fetches) == set(ids)
    assert max(fetches.values()) <= 2
    # Only requests in flight, or answered but not yet written, when the kill came are repeated.
    assert sum(1 for n in fetches.values() if n == 2) <= 2 * CONCURRENCY


async def test_a_partial_last_line_is_cut_off_before_appending(
    emu: ServiceEmulator, tmp_path: Path
) -> None:
    ids = [job["id"] for job in emu.jobs()[:20]]
    ids_file = tmp_path / "ids.txt"
    ids_file.write_text("\n".join(ids))  # no final newline: the last id still counts
    out = tmp_path / "out.jsonl"
    args = ("extract-many", str(ids_file), "-o", str(out))
    assert (await run_cli(*args, env=cli_env(emu))).code == 0
    complete = out.read_bytes().splitlines(keepends=True)
    assert len(complete) == 20
    # What a kill in the middle of writing the last line leaves behind.
    out.write_bytes(b"".join(complete[:-1]) + complete[-1][: len(complete[-1]) // 2])
    cut_id = read_jsonl_line(complete[-1])

    result = await run_cli(*args, env=cli_env(emu))
    assert result.code == 0, result.stderr
    assert "cut off a partial last line" in result.stderr
    lines = read_jsonl(out)  # every line parses, and the file ends with a newline
    assert len(lines) == 20
    assert sorted(line["jobId"] for line in lines) == sorted(ids)
    assert lines[-1]["jobId"] == cut_id
    fetches = extract_fetches(emu)
    assert fetches[cut_id] == 2
    assert sum(fetches.values()) == 21


def read_jsonl_line(line: bytes) -> str:
    job_id = msgspec.json.decode(line)["jobId"]
    assert isinstance(job_id, str)
    return job_id


async def test_a_line_that_does_not_parse_is_reported_and_its_id_fetched_again(
    emu: ServiceEmulator, tmp_path: Path
) -> None:
    ids = [job["id"] for job in emu.jobs()[:10]]
    ids_file = tmp_path / "ids.txt"
    ids_file.write_text("\n".join(ids) + "\n")
    out = tmp_path / "out.jsonl"
    args = ("extract-many", str(ids_file), "-o", str(out))
    assert (await run_cli(*args, env=cli_env(emu))).code == 0
    lines = out.read_bytes().splitlines(keepends=True)
    damaged_id = read_jsonl_line(lines[3])
    lines[3] = lines[3][:40] + b"\n"  # damaged in the middle, e.g. by an editor
    out.write_bytes(b"".join(lines))

    result = await run_cli(*args, env=cli_env(emu))
    assert result.code == 0, result.stderr
    assert f"1 line of {out} is not a line of extract-many" in result.stderr
    after = out.read_bytes().splitlines(keepends=True)
    assert after[:10] == lines  # nothing rewritten
    assert len(after) == 11
    assert read_jsonl_line(after[10]) == damaged_id
    assert extract_fetches(emu)[damaged_id] == 2


async def test_retry_failed_fetches_failures_again_and_appends(
    emu: ServiceEmulator, tmp_path: Path
) -> None:
    known = [job["id"] for job in emu.jobs()[:10]]
    unknown = _unknown_ids(2)
    ids_file = tmp_path / "ids.txt"
    ids_file.write_text("\n".join(known + unknown) + "\n")
    out = tmp_path / "out.jsonl"
    args = ("extract-many", str(ids_file), "-o", str(out))
    first = await run_cli(*args, env=cli_env(emu))
    assert first.code == 1
    assert [line["ok"] for line in read_jsonl(out)].count(False) == 2
    for job_id in unknown:  # the jobs appear on the service meanwhile
        emu.add_job(id=job_id, state="done")

    again = await run_cli(*args, env=cli_env(emu))
    assert again.code == 1  # failures are kept without --retry-failed
    assert "2 ids failed (2 from an earlier run)" in again.stderr
    assert sum(extract_fetches(emu).values()) == 12

    retried = await run_cli(*args, "--retry-failed", env=cli_env(emu))
    assert retried.code == 0, retried.stderr
    by_id = _by_id(read_jsonl(out))
    assert len(by_id) == 12
    for job_id in unknown:
        assert [line["ok"] for line in by_id[job_id]] == [False, True]  # the last line wins
    assert all(len(by_id[job_id]) == 1 for job_id in known)
    fetches = extract_fetches(emu)
    assert [fetches[job_id] for job_id in unknown] == [2, 2]
    assert sum(fetches.values()) == 14


async def test_ids_from_stdin_to_stdout(emu: ServiceEmulator) -> None:
    ids = [job["id"] for job in emu.jobs()[:30]]
    data = ("\n".join(ids + ids[:5]) + "\n").encode()
    result = await run_cli("extract-many", "-", "--output", "-", env=cli_env(emu), input=data)
    assert result.code == 0, result.stderr
    lines = [msgspec.json.decode(line) for line in result.stdout.splitlines()]
    assert sorted(line["jobId"] for line in lines) == sorted(ids)
    assert "30 ids, 30 ok, 0 failed" in result.stderr


async def test_a_refused_key_stops_the_export_and_writes_nothing(
    emu: ServiceEmulator, tmp_path: Path
) -> None:
    ids_file = tmp_path / "ids.txt"
    ids_file.write_text("\n".join(job["id"] for job in emu.jobs()[:50]) + "\n")
    out = tmp_path / "out.jsonl"
    result = await run_cli(
        "extract-many",
        str(ids_file),
        "-o",
        str(out),
        env=cli_env(emu, ASYNCSEARCH_API_KEY="wrong-key-4Fq"),
    )
    assert result.code == 1
    assert "refused the API key (401)" in result.stderr
    assert "wrong-key-4Fq" not in result.output
    assert out.read_bytes() == b""


async def test_bad_arguments_exit_2_before_anything_is_fetched(
    emu: ServiceEmulator, tmp_path: Path
) -> None:
    ids_file = tmp_path / "ids.txt"
    ids_file.write_text(emu.jobs()[0]["id"] + "\n")
    env = cli_env(emu)
    missing_ids, output_is_a_dir, no_concurrency, no_output = await asyncio.gather(
        run_cli("extract-many", str(tmp_path / "nope.txt"), "-o", str(tmp_path / "o"), env=env),
        run_cli("extract-many", str(ids_file), "-o", str(tmp_path), env=env),
        run_cli("extract-many", str(ids_file), "-o", "-", "--concurrency", "0", env=env),
        run_cli("extract-many", str(ids_file), env=env),
    )
    assert missing_ids.code == 2
    assert "cannot read the ids" in missing_ids.stderr
    assert output_is_a_dir.code == 2
    assert "cannot open the output file" in output_is_a_dir.stderr
    assert no_concurrency.code == 2
    assert "--concurrency" in no_concurrency.stderr
    assert no_output.code == 2
    assert "--output" in no_output.stderr
    assert emu.stats.count() == 0


async def test_a_second_export_to_the_same_file_is_refused(
    emu: ServiceEmulator, tmp_path: Path
) -> None:
    ids_file = tmp_path / "ids.txt"
    ids_file.write_text("\n".join(job["id"] for job in emu.jobs()[:40]) + "\n")
    out = tmp_path / "out.jsonl"
    args = ("extract-many", str(ids_file), "-o", str(out), "--concurrency", "2")
    # The first export is held at the gate (it has locked the file and sent its requests) until
    # the second one has been refused: no bet on how fast either process starts.
    emu.faults.hold("extract")
    first = await start_cli(*args, env=cli_env(emu))
    try:
        async with asyncio.timeout(RUN_TIMEOUT):
            await emu.faults.wait_parked(2, "extract")
        second = await run_cli(*args, env=cli_env(emu))
    finally:
        emu.faults.release()
    assert second.code == 2
    assert "being written by another extract-many" in second.stderr
    assert (await finish(first)).code == 0
    assert sorted(extract_fetches(emu).values()) == [1] * 40


@pytest.mark.parametrize("flag", ["-o", "--parquet"])
@pytest.mark.parametrize("link", ["same", "symlink", "hardlink", "stdin"])
async def test_an_output_that_is_the_ids_file_is_refused(
    emu: ServiceEmulator, tmp_path: Path, link: str, flag: str
) -> None:
    ids_file = tmp_path / "ids.txt"
    ids_file.write_text("\n".join(job["id"] for job in emu.jobs()[:5]) + "\n")
    before = ids_file.read_bytes()
    out = tmp_path / "out.jsonl"
    ids_arg = str(ids_file)
    if link in ("same", "stdin"):
        out = ids_file
    elif link == "symlink":
        out.symlink_to(ids_file)
    else:
        os.link(ids_file, out)
    if link == "stdin":  # `extract-many - -o ids.txt < ids.txt`
        ids_arg = "-"
        with ids_file.open("rb") as stdin:
            process = await start_cli(
                "extract-many", "-", flag, str(out), env=cli_env(emu), stdin=stdin.fileno()
            )
            result = await finish(process)
    else:
        result = await run_cli("extract-many", ids_arg, flag, str(out), env=cli_env(emu))
    assert result.code == 2, result.stderr
    assert "is the input" in result.stderr
    assert f"{flag if flag != '-o' else '--output'} {out}" in result.stderr
    assert (f"IDS {ids_file}" if link != "stdin" else "IDS - (stdin)") in result.stderr
    assert ids_file.read_bytes() == before
    assert emu.stats.count() == 0


async def test_stdout_onto_the_ids_file_is_refused(emu: ServiceEmulator, tmp_path: Path) -> None:
    # `extract-many ids.txt -o - >> ids.txt` would read its own lines back as ids forever.
    ids_file = tmp_path / "ids.txt"
    ids_file.write_text("\n".join(job["id"] for job in emu.jobs()[:5]) + "\n")
    before = ids_file.read_bytes()
    with ids_file.open("ab") as stdout:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "asyncsearch", "extract-many", str(ids_file), "-o", "-",
            env=cli_env(emu), stdin=asyncio.subprocess.DEVNULL, stdout=stdout,
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            async with asyncio.timeout(RUN_TIMEOUT):
                _, stderr = await process.communicate()
        finally:
            if process.returncode is None:  # it looped: stop it
                process.kill()
                await process.wait()
    assert process.returncode == 2, stderr
    assert f"the output --output - (stdout) is the input IDS {ids_file}" in stderr.decode()
    assert ids_file.read_bytes() == before
    assert emu.stats.count() == 0


@pytest.mark.parametrize(
    "content",
    [b"0d7c...\n1e8d...\n", b"\x89PNG\r\n\x1a\n\x00\x00binary", b"job_id,state\nabc,done\n"],
    ids=["a list of ids", "binary", "csv"],
)
async def test_an_output_that_is_not_json_lines_is_refused_and_kept(
    emu: ServiceEmulator, tmp_path: Path, content: bytes
) -> None:
    ids_file = tmp_path / "ids.txt"
    ids_file.write_text(emu.jobs()[0]["id"] + "\n")
    out = tmp_path / "notes.txt"
    out.write_bytes(content)
    result = await run_cli("extract-many", str(ids_file), "-o", str(out), env=cli_env(emu))
    assert result.code == 2, result.stderr
    assert f"{out} (--output): it exists and is not an export of extract-many" in result.stderr
    assert out.read_bytes() == content
    assert emu.stats.count() == 0


@pytest.mark.parametrize(
    "command",
    [("extract-many", "-o"), ("extract-many", "--parquet"), ("search", "--parquet")],
    ids=["extract-many -o", "extract-many --parquet", "search --parquet"],
)
async def test_an_output_in_a_missing_folder_is_a_usage_error_naming_it(
    emu: ServiceEmulator, tmp_path: Path, command: tuple[str, str]
) -> None:
    name, flag = command
    ids_file = tmp_path / "ids.txt"
    ids_file.write_text(emu.jobs()[0]["id"] + "\n")
    missing = tmp_path / "no-such-folder"
    target = str(missing / "out.file")
    first = str(ids_file) if name == "extract-many" else "invoice"
    result = await run_cli(name, first, flag, target, env=cli_env(emu))
    assert result.code == 2, result.stderr
    assert f"cannot open the output file {target} " in result.stderr
    assert f"there is no folder {missing}" in result.stderr
    assert ".partial" not in result.stderr
    assert not missing.exists()
    assert emu.stats.count() == 0


@pytest.mark.timeout(10)
async def test_the_progress_line_without_a_terminal_repeats_every_5_seconds(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A plain line on stderr every 5 s, again and again until stopped. The clock is held: each
    wait the progress asks of the loop is recorded and let go at once, so no 5 s go by."""
    loop = asyncio.get_running_loop()
    asked: list[float] = []

    def at_once(delay: float, callback: Any, *args: object, context: Any = None) -> Any:
        asked.append(delay)
        return loop.call_soon(callback, *args, context=context)

    monkeypatch.setattr(loop, "call_later", at_once)
    export = _export._Export({}, retry_failed=False, fetched_ok=2, fetched_failed=1, in_flight=4)
    lines = _export._ProgressLines(export, 10, time.monotonic() - 12)
    lines.start()
    await turns(4)  # each turn lets one held wait go
    lines.stop()
    printed = capsys.readouterr().err.splitlines()
    await turns(2)
    assert capsys.readouterr().err == ""  # none once stopped
    assert len(printed) >= 3, printed
    line = re.compile(r"extract-many: 3 of 10 fetched so far \(1 failed, 4 in flight\) after 1\d s")
    assert all(line.fullmatch(text) for text in printed), printed
    assert set(asked) == {5.0}
