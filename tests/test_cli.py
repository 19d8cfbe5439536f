"""The ``asyncsearch`` command, run for real in a subprocess against the emulator."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest
import pytest_asyncio

import asyncsearch
from asyncsearch import AsyncSearchClient, ExtractionJob, LinkPreview, SearchHit, WebhookLog
from asyncsearch.testing import ServiceEmulator

from .cli_helpers import TEST_KEY, cli_env, run_cli, run_python


@pytest_asyncio.fixture
async def emu() -> AsyncIterator[ServiceEmulator]:
    async with ServiceEmulator(api_key=TEST_KEY, seed=3) as emulator:
        yield emulator


@pytest_asyncio.fixture
async def client(emu: ServiceEmulator) -> AsyncIterator[AsyncSearchClient]:
    async with AsyncSearchClient(api_key=emu.api_key, base_url=emu.base_url) as c:
        yield c


def _job_with_logs(emu: ServiceEmulator) -> str:
    return next(job["id"] for job in emu.jobs() if len(emu.webhook_logs(job["id"])) >= 2)


# -- the command itself -----------------------------------------------------------------------


async def test_help_lists_the_commands_and_the_resume_rule() -> None:
    env = cli_env()
    main_help, export_help, version = await asyncio.gather(
        run_cli("--help", env=env),
        run_cli("extract-many", "--help", env=env),
        run_cli("--version", env=env),
    )
    assert main_help.code == 0, main_help.stderr
    for command in ("search", "extract", "link", "webhook-logs", "extract-many", "serve", "demo"):
        assert command in main_help.stdout
    assert "ASYNCSEARCH_API_KEY" in main_help.stdout
    assert export_help.code == 0
    assert "--retry-failed" in export_help.stdout
    assert "LAST line of each id" in export_help.stdout
    assert version.stdout.strip() == f"asyncsearch {asyncsearch.__version__}"


async def test_importing_the_cli_imports_neither_rich_nor_the_emulator() -> None:
    code = (
        "import sys, asyncsearch._cli; "
        "print([m for m in ('rich', 'asyncsearch.testing') if m in sys.modules])"
    )
    result = await run_python(code, env=cli_env())
    assert result.code == 0, result.stderr
    assert result.stdout.strip() == "[]"


async def test_without_rich_the_command_says_how_to_install_it() -> None:
    code = (
        "import sys; sys.modules['rich'] = None; "
        "from asyncsearch._cli import main; sys.exit(main(['search', 'x']))"
    )
    result = await run_python(code, env=cli_env())
    assert result.code == 2
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1
    assert "pip install -e '.[cli]' in a checkout of asyncsearch" in result.stderr
    assert "Traceback" not in result.stderr


# -- search -----------------------------------------------------------------------------------


async def test_search_prints_a_table_of_the_best_hits(
    emu: ServiceEmulator, client: AsyncSearchClient
) -> None:
    expected = await client.search("invoice", page_size=5)
    assert len(expected.hits) == 5
    result = await run_cli("search", "invoice", "--max-items", "5", env=cli_env(emu))
    assert result.code == 0, result.stderr
    for hit in expected.hits:
        assert hit.name is not None
        assert hit.name in result.stdout
        assert hit.id in result.stdout
    assert f"5 of {expected.total} hits" in result.stdout
    assert result.stderr == ""


async def test_search_json_writes_each_hit_in_its_wire_form(
    emu: ServiceEmulator, client: AsyncSearchClient
) -> None:
    result = await run_cli(
        "search", "invoice", "--json", "--max-items", "7", "--page-size", "3", env=cli_env(emu)
    )
    assert result.code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 7
    hits = [msgspec.json.decode(line, type=SearchHit) for line in lines]
    # Three pages walked for seven hits, and not one more.
    assert [r.body["pagination"] for r in emu.search_history] == [
        {"page": page, "pageSize": 3} for page in (1, 2, 3)
    ]
    # What the service sent for the same three pages, byte for byte before decoding.
    sent = []
    for page in (1, 2, 3):
        raw = await client.with_raw_response.search("invoice", page=page, page_size=3)
        sent += json.loads(raw.content)["hits"]
    assert [hit.id for hit in hits] == [hit["id"] for hit in sent[:7]]
    for line, wire in zip(lines, sent, strict=False):
        assert json.loads(line) == wire


async def test_search_sends_every_filter_and_option(emu: ServiceEmulator, tmp_path: Path) -> None:
    image = tmp_path / "photo.png"
    image.write_bytes(b"\x89PNG\r\n\x1a\n red bicycle")
    resource_id = emu.resources()[0]["id"]
    ids = [str(uuid.uuid4()) for _ in range(5)]
    result = await run_cli(
        "search",
        "invoice",
        "--image", str(image),
        "--resource-id", resource_id,
        "--kind", "document",
        "--kind", "image",
        "--color", "1",
        "--color", "2",
        "--parent-id", ids[0],
        "--ancestor-id", ids[1],
        "--tag-id", ids[2],
        "--user-id", ids[3],
        "--user-id", ids[4],
        "--created-after", "2020-01-01T02:00:00+02:00",
        "--created-before", "2030-01-01T00:00:00Z",
        "--precision", "0.1",
        "--sort", "createdAt:asc",
        "--page-size", "4",
        "--max-items", "4",
        env=cli_env(emu),
    )  # fmt: skip
    assert result.code == 0, result.stderr
    assert emu.search_history[-1].body == {
        "text": "invoice",
        "image": asyncsearch.image_data_url(image),
        "resourceId": resource_id,
        "filters": {
            "kinds": ["document", "image"],
            "color": [1, 2],
            "parentIds": [ids[0]],
            "ancestorIds": [ids[1]],
            "tagIds": [ids[2]],
            "userIds": [ids[3], ids[4]],
            "createdAfter": "2020-01-01T00:00:00Z",
            "createdBefore": "2030-01-01T00:00:00Z",
        },
        "precision": 0.1,
        "pagination": {"page": 1, "pageSize": 4},
        "sort": {"field": "createdAt", "order": "asc"},
    }
    # Incognito searches are not kept by the service: the flag reached it if none is added.
    searches = len(emu.search_history)
    result = await run_cli("search", "invoice", "--incognito", env=cli_env(emu))
    assert result.code == 0, result.stderr
    assert emu.stats.count("search") == searches + 1
    assert len(emu.search_history) == searches


async def test_search_refuses_a_timestamp_without_offset(emu: ServiceEmulator) -> None:
    result = await run_cli("search", "x", "--created-after", "2024-01-01", env=cli_env(emu))
    assert result.code == 2
    assert "UTC offset" in result.stderr
    assert emu.stats.count() == 0


async def test_search_counts_hits_in_the_singular_and_plural(emu: ServiceEmulator) -> None:
    emu.add_resource(base_id="solo", name="Zanzibar ledger", text="zanzibar ledger")
    emu.add_resource(base_id="solo", name="Quokka notes", text="quokka notes")
    one = await run_cli("search", "zanzibar", "--base-id", "solo", env=cli_env(emu))
    assert one.code == 0, one.stderr
    assert one.stdout.rstrip().endswith("\n1 hit"), one.stdout
    capped = await run_cli(
        "search", "--base-id", "solo", "--max-items", "1", "--page-size", "1", env=cli_env(emu)
    )
    assert capped.code == 0, capped.stderr
    assert capped.stdout.rstrip().endswith("\n1 of 2 hits"), capped.stdout


async def test_search_refuses_a_page_below_the_first_before_sending(emu: ServiceEmulator) -> None:
    result = await run_cli("search", "invoice", "--page", "0", env=cli_env(emu))
    assert result.code == 2
    # Said with the flag, not the library's argument name.
    assert "--page must be >= 1, got 0" in result.stderr
    assert "start_page" not in result.stderr
    assert "first_page" not in result.stderr
    assert emu.stats.count() == 0
    later = await run_cli("search", "invoice", "--page", "2", "--max-items", "3", env=cli_env(emu))
    assert later.code == 0, later.stderr
    assert [r.body["pagination"]["page"] for r in emu.search_history] == [2]


async def test_log_lines_say_the_flags_not_the_library_names(emu: ServiceEmulator) -> None:
    result = await run_cli(
        "search", "--kind", "document", "--max-items", "3", "--page-size", "3", "-vv",
        env=cli_env(emu),
    )  # fmt: skip
    assert result.code == 0, result.stderr
    assert "stopped paging at --max-items 3; more results remain" in result.stderr
    assert "(resume with --page 2)" in result.stderr
    for name in ("start_page", "max_items", "page_size", "max_pages"):
        assert name not in result.stderr


@pytest.mark.parametrize("link", ["same", "symlink", "hardlink"])
async def test_search_parquet_never_writes_over_its_image(
    emu: ServiceEmulator, tmp_path: Path, link: str
) -> None:
    image = tmp_path / "photo.png"
    image.write_bytes(b"\x89PNG\r\n\x1a\n red bicycle")
    target = tmp_path / "hits.parquet"
    if link == "same":
        target = image
    elif link == "symlink":
        target.symlink_to(image)
    else:
        os.link(image, target)
    result = await run_cli(
        "search", "--image", str(image), "--parquet", str(target), env=cli_env(emu)
    )
    assert result.code == 2, result.stderr
    assert f"--parquet {target}" in result.stderr
    assert f"--image {image}" in result.stderr
    assert "the same file" in result.stderr
    assert image.read_bytes() == b"\x89PNG\r\n\x1a\n red bicycle"
    assert emu.stats.count() == 0


@pytest.mark.parametrize("json_lines", [False, True], ids=["table", "json"])
async def test_output_into_a_closed_pipe_exits_141(emu: ServiceEmulator, json_lines: bool) -> None:
    # `asyncsearch search x | head -0`: the reader is gone before anything is written.
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "asyncsearch",
            "search",
            "invoice",
            *(["--json"] if json_lines else []),
            env=cli_env(emu),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=write_end,
            stderr=asyncio.subprocess.PIPE,
        )
    finally:
        os.close(write_end)
    async with asyncio.timeout(30):
        _, stderr = await process.communicate()
    assert process.returncode == 141
    assert stderr == b""  # quiet, like any Unix tool whose reader went away


# -- one-call commands ------------------------------------------------------------------------


async def test_extract_prints_the_job_and_its_markdown(
    emu: ServiceEmulator, client: AsyncSearchClient
) -> None:
    job_id = emu.jobs()[0]["id"]
    env = cli_env(emu)
    as_json, as_markdown, one_line = await asyncio.gather(
        run_cli("extract", job_id, env=env),
        run_cli("extract", job_id, "--format", "markdown", env=env),
        run_cli("extract", job_id, "--json", env=env),
    )
    assert as_json.code == 0, as_json.stderr
    assert msgspec.json.decode(as_json.stdout, type=ExtractionJob) == (
        await client.get_extraction(job_id)
    )
    assert as_json.stdout.startswith("{\n  ")
    markdown = await client.get_extraction(job_id, format="markdown")
    assert markdown.extraction is not None
    assert markdown.extraction.common is not None
    caption = markdown.extraction.common.caption
    assert caption is not None
    assert caption.startswith("# ")
    assert as_markdown.code == 0, as_markdown.stderr
    assert as_markdown.stdout == caption.rstrip("\n") + "\n"
    assert one_line.code == 0
    assert one_line.stdout.count("\n") == 1
    assert msgspec.json.decode(one_line.stdout, type=ExtractionJob).id == job_id


async def test_link_and_webhook_logs(emu: ServiceEmulator, client: AsyncSearchClient) -> None:
    url = emu.page_urls[0]
    job_id = _job_with_logs(emu)
    logs = await client.list_webhook_logs(job_id)
    env = cli_env(emu)
    table, link_json, log_table, log_lines, detail = await asyncio.gather(
        run_cli("link", url, env=env),
        run_cli("link", url, "--type", "link", "--json", env=env),
        run_cli("webhook-logs", job_id, env=env),
        run_cli("webhook-logs", job_id, "--json", env=env),
        run_cli("webhook-logs", job_id, logs[-1].id, env=env),
    )
    for result in (table, link_json, log_table, log_lines, detail):
        assert result.code == 0, result.stderr
    preview = await client.link_preview(url)
    assert preview.title
    assert preview.title in table.stdout
    assert msgspec.json.decode(link_json.stdout, type=LinkPreview) == preview
    assert [log.id in log_table.stdout for log in logs] == [True] * len(logs)
    assert [msgspec.json.decode(line, type=asyncsearch.WebhookLogSummary) for line in (
        log_lines.stdout.splitlines()
    )] == logs  # fmt: skip
    assert msgspec.json.decode(detail.stdout, type=WebhookLog) == (
        await client.get_webhook_log(job_id, logs[-1].id)
    )


# -- failures a shell user meets --------------------------------------------------------------


async def test_a_refused_key_exits_1_without_showing_the_key(emu: ServiceEmulator) -> None:
    secret = "wrong-key-Zq81xT"
    job_id = emu.jobs()[0]["id"]
    from_env, from_flag = await asyncio.gather(
        run_cli("extract", job_id, env=cli_env(emu, ASYNCSEARCH_API_KEY=secret)),
        run_cli("--api-key", secret, "search", "invoice", env=cli_env(emu)),
    )
    for result in (from_env, from_flag):
        assert result.code == 1
        assert "refused the API key (401)" in result.stderr
        assert secret not in result.output
        assert "Traceback" not in result.output
    assert emu.stats.count() == 2


async def test_a_missing_key_or_url_exits_2_naming_what_to_set() -> None:
    no_key, no_url = await asyncio.gather(
        run_cli("search", "x", env=cli_env(ASYNCSEARCH_BASE_URL="http://127.0.0.1:9")),
        run_cli("search", "x", env=cli_env(ASYNCSEARCH_API_KEY="k")),
    )
    assert no_key.code == 2
    assert "ASYNCSEARCH_API_KEY" in no_key.stderr
    assert "--api-key" in no_key.stderr
    assert no_url.code == 2
    assert "ASYNCSEARCH_BASE_URL" in no_url.stderr
    assert "--base-url" in no_url.stderr
    assert "Traceback" not in no_key.output + no_url.output


async def test_unknown_and_invalid_job_ids(emu: ServiceEmulator) -> None:
    unknown = "9b2e4c6a-1d3f-4a5b-8c7d-0e1f2a3b4c5d"
    env = cli_env(emu)
    missing, invalid, no_log = await asyncio.gather(
        run_cli("extract", unknown, env=env),
        run_cli("extract", "not-a-job-id", env=env),
        run_cli("webhook-logs", emu.jobs()[0]["id"], unknown, env=env),
    )
    assert missing.code == 1
    assert "not found" in missing.stderr
    assert unknown in missing.stderr
    assert no_log.code == 1
    assert f"webhook log {unknown}" in no_log.stderr
    assert invalid.code == 2
    assert "job_id must match the UUID pattern" in invalid.stderr
    # The invalid id was refused before anything was sent.
    assert emu.stats.count("extract") == 1
    for result in (missing, invalid, no_log):
        assert result.stdout == ""
        assert "Traceback" not in result.stderr
