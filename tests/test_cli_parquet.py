"""``--parquet FILE`` of ``search`` and ``extract-many``: the tables of ``asyncsearch.arrow``."""

from __future__ import annotations

import asyncio
import re
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

pytest.importorskip(
    "pyarrow", reason="--parquet needs pyarrow (the arrow extra, in the test extra)"
)

import pyarrow as pa
import pyarrow.parquet as pq
import pytest_asyncio

from asyncsearch import AsyncSearchClient
from asyncsearch._cli._parquet import FLUSH_ROWS, ROWS_PER_GROUP
from asyncsearch.arrow import EXTRACTION_SCHEMA, extractions_table, search_table
from asyncsearch.testing import ServiceEmulator

from .cli_helpers import (
    RUN_TIMEOUT,
    TEST_KEY,
    cli_env,
    extract_fetches,
    finish,
    read_stderr_until,
    run_cli,
    start_cli,
)

pytestmark = pytest.mark.timeout(120)

N_JOBS = 120
CONCURRENCY = 4


@pytest_asyncio.fixture
async def emu() -> AsyncIterator[ServiceEmulator]:
    async with ServiceEmulator(api_key=TEST_KEY, seed=3, n_resources=60, n_jobs=N_JOBS) as e:
        yield e


def _rows(table: pa.Table) -> list[dict[str, object]]:
    """The rows, by column name: a file read back names a list's child field differently."""
    return table.to_pylist()


async def test_search_parquet_reads_back_as_search_table(
    emu: ServiceEmulator, tmp_path: Path
) -> None:
    out = tmp_path / "hits.parquet"
    result = await run_cli(
        "search", "--kind", "document", "--page-size", "7", "--parquet", str(out), env=cli_env(emu)
    )
    assert result.code == 0, result.stderr
    async with AsyncSearchClient(TEST_KEY, base_url=emu.base_url) as client:
        expected = await search_table(client, filters={"kinds": ["document"]}, page_size=7)
    written = pq.read_table(out)
    assert written.num_rows == expected.num_rows > 7
    assert written.schema.names == expected.schema.names
    assert [f.type.list_size for f in written.schema if pa.types.is_fixed_size_list(f.type)] == [
        f.type.list_size for f in expected.schema if pa.types.is_fixed_size_list(f.type)
    ]
    assert _rows(written) == _rows(expected)
    assert f"search: wrote {expected.num_rows} hits to {out}" in result.stderr
    assert not (tmp_path / "hits.parquet.partial").exists()
    # Pages are gathered into row groups of ROWS_PER_GROUP rows, not one row group per page.
    pages = -(-expected.num_rows // 7)
    assert pages > 1
    assert pq.ParquetFile(out).metadata.num_row_groups == 1 < pages

    # A second search onto the file replaces it only when told to (it resumes nothing).
    cut = await run_cli(
        "search", "--parquet", str(out), "--max-items", "9", "--force", env=cli_env(emu)
    )
    assert cut.code == 0, cut.stderr
    assert pq.read_table(out).num_rows == 9


async def test_extract_many_parquet_has_every_id_once_as_extractions_table(
    emu: ServiceEmulator, tmp_path: Path
) -> None:
    ids = [job["id"] for job in emu.jobs()[:30]] + ["00000000-0000-4000-8000-000000000000"]
    ids_file = tmp_path / "ids.txt"
    ids_file.write_text("\n".join(ids + ids[:5]) + "\n")  # repeated ids are fetched once
    out = tmp_path / "jobs.parquet"
    result = await run_cli("extract-many", str(ids_file), "--parquet", str(out), env=cli_env(emu))
    assert result.code == 1, result.stderr  # one id failed
    assert "31 ids, 30 ok, 1 failed" in result.stderr
    written = pq.read_table(out)
    assert written.schema == EXTRACTION_SCHEMA
    async with AsyncSearchClient(TEST_KEY, base_url=emu.base_url) as client:
        expected = await extractions_table(client, ids)

    def by_id(table: pa.Table) -> dict[object, dict[str, object]]:
        rows = {row["job_id"]: row for row in table.to_pylist()}
        for row in rows.values():
            # Each answer has its own X-Request-Id, which the error message ends with.
            if isinstance(row["error"], str):
                row["error"] = re.sub(r" \[request id [^]]+\]$", "", row["error"])
        return rows

    assert written.num_rows == len(ids)
    assert by_id(written) == by_id(expected)


async def test_an_interrupted_parquet_export_resumes_with_every_id_once(
    emu: ServiceEmulator, tmp_path: Path
) -> None:
    ids = [job["id"] for job in emu.jobs()]
    ids_file = tmp_path / "ids.txt"
    ids_file.write_text("\n".join(ids) + "\n")
    out = tmp_path / "jobs.parquet"
    args = ("extract-many", str(ids_file), "--parquet", str(out), "--concurrency", str(CONCURRENCY))
    # 40 fetches pass, then every worker is parked at the gate: the run is in the middle when
    # the signal comes, however fast this machine is.
    emu.faults.hold("extract", after=40)
    process = await start_cli(*args, env=cli_env(emu))
    async with asyncio.timeout(RUN_TIMEOUT):
        await emu.faults.wait_parked(CONCURRENCY, "extract")
    process.send_signal(signal.SIGINT)
    # Let the requests in flight go once the command says it is stopping (no new id starts).
    head = await read_stderr_until(process, b"stopping")
    emu.faults.release()
    first = await finish(process)
    assert first.code == 130, head + first.stderr
    written = pq.read_table(out)
    assert written.num_rows == 40 + CONCURRENCY
    # What was in flight was written: every request made has its row.
    assert sum(extract_fetches(emu).values()) == written.num_rows

    emu.faults.clear()
    second = await run_cli(*args, env=cli_env(emu))
    assert second.code == 0, second.stderr
    assert f"{written.num_rows} already in" in second.stderr
    final = pq.read_table(out)
    assert sorted(final.column("job_id").to_pylist()) == sorted(ids)
    assert final.slice(0, written.num_rows).equals(written)  # the earlier rows, kept as they were
    assert set(extract_fetches(emu).values()) == {1}


async def test_retry_failed_replaces_the_failed_rows(emu: ServiceEmulator, tmp_path: Path) -> None:
    ids = [job["id"] for job in emu.jobs()[:6]]
    ids_file = tmp_path / "ids.txt"
    ids_file.write_text("\n".join(ids) + "\n")
    out = tmp_path / "jobs.parquet"
    emu.faults.script("extract", [404, 404])  # the first two fetches fail
    first = await run_cli(
        "extract-many",
        str(ids_file),
        "--parquet",
        str(out),
        "--concurrency",
        "1",
        env=cli_env(emu),
    )
    assert first.code == 1, first.stderr
    assert pq.read_table(out).column("error").null_count == 4
    again = await run_cli("extract-many", str(ids_file), "--parquet", str(out), env=cli_env(emu))
    assert again.code == 1  # failures kept: not fetched again without --retry-failed
    assert sum(extract_fetches(emu).values()) == 6
    retried = await run_cli(
        "extract-many", str(ids_file), "--parquet", str(out), "--retry-failed", env=cli_env(emu)
    )
    assert retried.code == 0, retried.stderr
    final = pq.read_table(out)
    assert sorted(final.column("job_id").to_pylist()) == sorted(ids)
    assert final.column("error").null_count == 6
    assert sum(extract_fetches(emu).values()) == 8


async def test_a_file_that_is_not_an_export_is_refused_and_kept(
    emu: ServiceEmulator, tmp_path: Path
) -> None:
    ids_file = tmp_path / "ids.txt"
    ids_file.write_text(emu.jobs()[0]["id"] + "\n")
    notes = tmp_path / "notes.parquet"
    notes.write_bytes(b"my notes, not a Parquet file")
    hits = tmp_path / "hits.parquet"
    pq.write_table(pa.table({"id": ["a"]}), hits)
    for target in (notes, hits):
        before = target.read_bytes()
        result = await run_cli(
            "extract-many", str(ids_file), "--parquet", str(target), env=cli_env(emu)
        )
        assert result.code != 0
        assert result.code == 2
        assert f"{target} (--parquet): it exists and is not a Parquet export" in result.stderr
        assert "Choose another file, or add --force" in result.stderr
        assert target.read_bytes() == before
        assert not (tmp_path / f"{target.name}.parts").exists()
    assert sum(extract_fetches(emu).values()) == 0
    both = await run_cli(
        "extract-many", str(ids_file), "-o", "x.jsonl", "--parquet", "x.parquet", env=cli_env(emu)
    )
    assert both.code == 2
    assert "not allowed with argument" in both.stderr


async def test_a_killed_parquet_export_leaves_the_last_file_and_resumes(
    emu: ServiceEmulator, tmp_path: Path
) -> None:
    ids = [job["id"] for job in emu.jobs()[:60]]
    ids_file = tmp_path / "ids.txt"
    ids_file.write_text("\n".join(ids[:20]) + "\n")
    out = tmp_path / "jobs.parquet"
    args = ("extract-many", str(ids_file), "--parquet", str(out), "--concurrency", "2")
    first = await run_cli(*args, env=cli_env(emu))
    assert first.code == 0, first.stderr
    before = out.read_bytes()
    parts = tmp_path / "jobs.parquet.parts"
    assert not parts.exists()  # merged into FILE and removed

    # A second run over more ids, killed outright while its requests are parked, before it
    # has results enough for a finished part.
    ids_file.write_text("\n".join(ids) + "\n")
    emu.faults.hold("extract", after=10)
    process = await start_cli(*args, env=cli_env(emu))
    async with asyncio.timeout(RUN_TIMEOUT):
        await emu.faults.wait_parked(2, "extract")
    process.kill()
    await finish(process)
    emu.faults.release()
    emu.faults.clear()
    assert out.read_bytes() == before  # the last complete file, as it was
    assert not list(parts.glob("*.parquet"))
    # What a kill in the middle of writing a part leaves: an unfinished part, never read.
    (parts / "00000001.parquet.tmp").write_bytes(b"PAR1" + b"garbage of a killed run" * 1000)

    third = await run_cli(*args, env=cli_env(emu))
    assert third.code == 0, third.stderr
    final = pq.read_table(out)
    assert sorted(final.column("job_id").to_pylist()) == sorted(ids)
    assert not parts.exists()


def _finished_parts(parts: Path) -> list[Path]:
    return sorted(parts.glob("*.parquet"))


async def _wait_for_a_finished_part(parts: Path) -> None:
    """Poll the folder until a finished part is there (the caller bounds the wait)."""
    while True:
        if _finished_parts(parts):
            return
        await asyncio.sleep(0.02)


async def test_a_parquet_export_killed_outright_keeps_its_finished_parts_and_resumes(
    tmp_path: Path,
) -> None:
    # More results than one part holds, and a gate that parks every request past them: the
    # run is certainly unfinished when it is killed, however fast this machine is.
    fetched_before_kill = FLUSH_ROWS + 50
    n_jobs = FLUSH_ROWS + 200
    async with ServiceEmulator(api_key=TEST_KEY, seed=5, n_resources=5, n_jobs=n_jobs) as emu:
        ids = [job["id"] for job in emu.jobs()]
        ids_file = tmp_path / "ids.txt"
        ids_file.write_text("\n".join(ids) + "\n")
        out = tmp_path / "jobs.parquet"
        parts = tmp_path / "jobs.parquet.parts"
        args = (
            "extract-many", str(ids_file), "--parquet", str(out), "--concurrency", str(CONCURRENCY)
        )  # fmt: skip
        emu.faults.hold("extract", after=fetched_before_kill)
        process = await start_cli(*args, env=cli_env(emu))
        try:
            async with asyncio.timeout(RUN_TIMEOUT):
                await emu.faults.wait_parked(CONCURRENCY, "extract")
                await _wait_for_a_finished_part(parts)
        finally:
            process.kill()
            await finish(process)
        emu.faults.release()
        emu.faults.clear()
        assert not out.exists()  # never merged: the run was killed

        finished = _finished_parts(parts)
        written = pa.concat_tables([pq.read_table(part) for part in finished])
        assert written.schema == EXTRACTION_SCHEMA
        assert written.num_rows == FLUSH_ROWS * len(finished) >= FLUSH_ROWS
        kept = written.column("job_id").to_pylist()
        assert len(set(kept)) == len(kept)
        first_fetches = extract_fetches(emu)
        assert all(first_fetches[job_id] == 1 for job_id in kept)

        second = await run_cli(*args, env=cli_env(emu))
        assert second.code == 0, second.stderr
        assert f"{len(kept)} already in" in second.stderr
        final = pq.read_table(out)
        assert final.schema == EXTRACTION_SCHEMA
        assert sorted(final.column("job_id").to_pylist()) == sorted(ids)  # every id once
        assert final.column("error").null_count == len(ids)
        fetches = extract_fetches(emu)
        # What was in a finished part was not fetched again; the rest at most once more.
        assert all(fetches[job_id] == 1 for job_id in kept)
        assert set(fetches) == set(ids)
        assert max(fetches.values()) <= 2
        assert not parts.exists()
        # The parts were merged into row groups of ROWS_PER_GROUP, not one per part.
        assert n_jobs <= ROWS_PER_GROUP
        assert pq.ParquetFile(out).metadata.num_row_groups == 1


async def test_output_onto_a_parquet_file_is_refused_and_kept(
    emu: ServiceEmulator, tmp_path: Path
) -> None:
    ids_file = tmp_path / "ids.txt"
    ids_file.write_text(emu.jobs()[0]["id"] + "\n")
    results = tmp_path / "results.parquet"
    pq.write_table(pa.table({"job_id": ["a\nb", "c"]}), results)
    before = results.read_bytes()
    # -o for --parquet, an easy slip: appending JSON Lines would make the file unreadable.
    result = await run_cli("extract-many", str(ids_file), "-o", str(results), env=cli_env(emu))
    assert result.code == 2, result.stderr
    assert f"{results} (--output): it exists and is not an export of extract-many" in result.stderr
    assert "it is a Parquet file" in result.stderr
    assert "--parquet" in result.stderr
    assert results.read_bytes() == before
    assert pq.read_table(results).num_rows == 2
    assert emu.stats.count() == 0


def test_row_groups_are_cut_by_rows_or_by_bytes_held(tmp_path: Path) -> None:
    from asyncsearch._cli._parquet import _GroupedWriter

    def batch(rows: int) -> pa.RecordBatch:
        return pa.record_batch({"v": pa.array([b"x" * 100] * rows, pa.binary())})

    def row_groups(path: Path, **bounds: int) -> list[int]:
        with path.open("wb") as handle:
            writer = _GroupedWriter(handle, **bounds)
            for _ in range(10):
                writer.write(batch(20))  # ten pages of 20 rows, 2 kB each
            writer.close(None)
        metadata = pq.ParquetFile(path).metadata
        return [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)]

    assert row_groups(tmp_path / "rows.parquet", rows_per_group=50) == [60, 60, 60, 20]
    assert row_groups(tmp_path / "one.parquet") == [200]
    held = batch(20).nbytes
    assert row_groups(tmp_path / "bytes.parquet", max_group_bytes=2 * held) == [40] * 5
