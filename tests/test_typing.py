"""What a type checker sees: ``mypy --strict`` and pyright strict on small snippets of user code.

These prove promises that only exist for a type checker (narrowing, Literal arguments, overload
return types); the runtime side is tested elsewhere.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("mypy", reason="the typing tests run mypy (in the test extra)")
pytest.importorskip("pyright", reason="the typing tests run pyright (in the test extra)")

_TIMEOUT = 120

GOOD = """
from typing import Unpack, assert_type

import aiohttp
import numpy
import numpy.typing

from asyncsearch.models import Embeddings

from asyncsearch import (
    AsyncSearchClient,
    SearchClient,
    SyncSearchPager,
    ExtractionFailure,
    ExtractionJob,
    ExtractionResult,
    ExtractionSuccess,
    SearchHit,
    SearchPage,
    APIResponse,
    RequestOptions,
    RetryPolicy,
    SearchCallParams,
    Timeout,
    LinkPreview,
    WaitTimeoutError,
    WebhookLog,
)
from asyncsearch.models import WebhookLogSummary


def narrow(result: ExtractionResult) -> str:
    if result.ok is True:
        # No second None check: .ok narrows the union (mypy also on a bare `if result.ok:`).
        assert_type(result, ExtractionSuccess)
        assert_type(result.job, ExtractionJob)
        return result.job.id
    assert_type(result, ExtractionFailure)
    return str(result.error)


def narrow_as_the_readme_teaches(result: ExtractionResult) -> str:
    # Issue 27: pyright did not narrow the README's `if result.ok:`; these forms narrow in both.
    if isinstance(result, ExtractionSuccess):
        assert_type(result.job, ExtractionJob)
        return result.job.id
    assert_type(result, ExtractionFailure)
    match result:
        case ExtractionFailure(error=error):
            return str(error)


async def calls(client: AsyncSearchClient) -> None:
    assert_type(await client.search("q", page=2, page_size=10), SearchPage)
    # One page type whatever embeddings= says: the vectors are decoded on first read, or None.
    assert_type(await client.search("q", embeddings=False), SearchPage)
    raw = await client.with_raw_response.search("q", embeddings=False, sort={"field": "name"})
    assert_type(raw, APIResponse[SearchPage])
    assert_type(await client.get_extraction("id", format="markdown"), ExtractionJob)
    assert_type(await client.link_preview("https://example.com", type="cache"), LinkPreview)
    assert_type(await client.list_webhook_logs("id"), list[WebhookLogSummary])
    assert_type(await client.get_webhook_log("id", "log"), WebhookLog)
    # The raw variant of each endpoint: the same arguments, an APIResponse of the same model.
    raws = client.with_raw_response
    assert_type(await raws.get_extraction("id", format="json"), APIResponse[ExtractionJob])
    assert_type(await raws.link_preview("https://example.com"), APIResponse[LinkPreview])
    listed = await raws.list_webhook_logs("id", timeout=1)
    assert_type(listed, APIResponse[list[WebhookLogSummary]])
    assert_type(await raws.get_webhook_log("id", "log"), APIResponse[WebhookLog])
    assert_type((await raws.search("q")).parse(), SearchPage)
    await client.wait_for_extraction("id", until={"processing", "done"})
    async with client.search_hits("q", embeddings=False, max_items=5) as hits:
        async for hit in hits:
            assert_type(hit, SearchHit)
            assert_type(hit.embeddings, Embeddings | None)
            print(hit.id)
    async with client.search_pages("q", embeddings=True) as pages:
        async for page in pages:
            assert_type(page.hits[0].embeddings, Embeddings | None)
    # Issue 38: a float32 array for type checkers (numpy stays optional at run time).
    matrix = (await client.search("q")).embedding_matrix("clip2")
    assert_type(matrix, numpy.typing.NDArray[numpy.float32])
    assert_type(matrix.dtype.type, type[numpy.float32])
    built = SearchHit(id="a", embeddings=Embeddings(small3_512=[1.0]))
    built.embeddings = None


async def plain_values(client: AsyncSearchClient, flag: bool, ids: list[str]) -> None:
    # A plain bool, not a literal: still the one page type.
    assert_type(await client.search("q", embeddings=flag), SearchPage)
    async with client.search_hits("q", embeddings=flag) as hits:
        async for hit in hits:
            assert_type(hit, SearchHit)
    # Each result carries its id back with the type it was given.
    results = await client.gather_extractions(ids)
    assert_type(results[0].job_id, str)
    async with client.iter_extractions(ids) as iterated:
        async for result in iterated:
            assert_type(result.job_id, str)
    try:
        await client.wait_for_extraction(ids[0], max_wait=1)
    except WaitTimeoutError as exc:
        assert_type(exc.job, ExtractionJob | None)


async def per_call_options(client: AsyncSearchClient, ids: list[str]) -> None:
    page = await client.search(
        "q",
        page=2,
        timeout=5,
        max_retries=0,
        extra_headers={"X-Trace": "1"},
        extra_query={"debug": True, "n": 2},
        extra_body={"newField": [1, 2]},
    )
    assert_type(page, SearchPage)
    # Issue 38: the request id of a plain call's answer, public to strict type checkers too.
    assert_type(page.request_id, str | None)
    await client.get_extraction("id", format="json", timeout=Timeout(read=5), extra_query={})
    raw = await client.with_raw_response.get_webhook_log("j", "l", timeout=None)
    assert_type(raw.request_id, str | None)
    await client.gather_extractions(ids, concurrency=4, max_retries=1, extra_headers={"X": "y"})
    async with client.search_pages("q", extra_body={"x": 1}, timeout=2.5) as pages:
        async for one in pages:
            assert_type(one, SearchPage)
    await client.wait_for_extraction("id", max_wait=60, timeout=10)
    options: RequestOptions = {"timeout": 3, "max_retries": 1}
    await client.link_preview("https://example.com", **options)


async def find(
    client: AsyncSearchClient, text: str, **params: Unpack[SearchCallParams]
) -> SearchPage:
    # Issue 38: one exported TypedDict for a wrapper's search arguments and call options.
    return await client.search(text, **params)


async def wrapped(client: AsyncSearchClient) -> None:
    page = await find(client, "q", page_size=5, filters={"kinds": ["document"]}, timeout=10)
    assert_type(page, SearchPage)
    await find(client, "q", max_retries=0, extra_headers={"X": "1"}, deadline=5)


async def tag(
    request: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType
) -> aiohttp.ClientResponse:
    request.headers["X-Tag"] = "1"
    return await handler(request)


async def retry_deadline_middlewares(client: AsyncSearchClient) -> None:
    policy = RetryPolicy(max_retries=4, statuses={429, 503}, cap=2.0, jitter=False)
    patient = client.with_options(retry=policy, deadline=30, middlewares=[tag])
    page = await patient.search("q", retry=RetryPolicy(), deadline=2.5, middlewares=(tag,))
    assert_type(page, SearchPage)
    await client.gather_extractions(["id"], deadline=None, middlewares=[tag])


def blocking(client: SearchClient, ids: list[str]) -> None:
    # Issue 46: the blocking twin, with the async methods' own parameters and blocking types.
    assert_type(client.search("q", page_size=2, timeout=5), SearchPage)
    assert_type(client.get_extraction("id", format="markdown"), ExtractionJob)
    assert_type(client.link_preview("https://example.com", type="cache"), LinkPreview)
    assert_type(client.list_webhook_logs("id"), list[WebhookLogSummary])
    assert_type(client.with_raw_response.search("q"), APIResponse[SearchPage])
    assert_type(client.with_raw_response.get_webhook_log("j", "l"), APIResponse[WebhookLog])
    assert_type(client.gather_extractions(ids, concurrency=4)[0].job_id, str)
    with client.iter_extractions(ids, ordered=True, max_retries=1) as results:
        for result in results:
            assert_type(result.job_id, str)
    with client.search_hits("q", max_items=5, embeddings=False) as hits:
        for hit in hits:
            assert_type(hit, SearchHit)
        assert_type(hits.next_page, int | None)
        assert_type(hits, SyncSearchPager[SearchHit])
    for page in client.search_pages("q", max_pages=2, extra_body={"x": 1}):
        assert_type(page, SearchPage)
    assert_type(client.wait_for_extraction("id", max_wait=60), ExtractionJob)
    assert_type(client.with_options(max_retries=0), SearchClient)


def make_blocking() -> None:
    with SearchClient("key", base_url="https://x", timeout=5, retry=RetryPolicy()) as client:
        assert_type(client.is_closed, bool)
"""

BAD = """
from asyncsearch import AsyncSearchClient, ExtractionResult, SearchClient, SearchPage


def no_narrowing(result: ExtractionResult) -> str:
    return result.job.id


async def typos(client: AsyncSearchClient) -> None:
    await client.get_extraction("id", format="markdwon")
    await client.link_preview("https://example.com", type="cached")
    await client.search("q", pagesize=10)
    client.search_pages("q", page=2)
    await client.get_extraction("id", extra_body={"a": 1})
    await client.search("q", timeout="5")
    await client.gather_extractions(["id"], max_retries="1")
    await client.list_webhook_logs("id", extra_headers={"X": 1})
    await client.with_raw_response.get_extraction("id", format="markdwon")
    await client.with_raw_response.search("q", pagesize=10)
    page: SearchPage = (await client.with_raw_response.search("q")).hits
    await client.search("q", deadline="5")
    await client.get_extraction("id", retry=3)


def blocking_typos(client: SearchClient) -> None:
    client.get_extraction("id", format="markdwon")
    client.search("q", pagesize=10)
    client.with_raw_response.search("q", pagesize=10)
    page: SearchPage = client.with_raw_response.search("q").hits
    client.gather_extractions(["id"], max_retries="1")
    client.search_pages("q", page=2)
    SearchClient("k", base_ur="https://x")
    hit_count: int = client.search_hits("q").total
"""


def _mypy(tmp_path: Path, code: str) -> subprocess.CompletedProcess[str]:
    snippet = tmp_path / "snippet.py"
    snippet.write_text(textwrap.dedent(code))
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--no-incremental",
            "--cache-dir",
            str(tmp_path / ".mypy_cache"),
            str(snippet),
        ],
        capture_output=True,
        text=True,
        timeout=_TIMEOUT,
        cwd=tmp_path,
        check=False,
    )


@pytest.mark.timeout(_TIMEOUT * 2)
def test_typed_code_narrows_results_and_keeps_overload_types(tmp_path: Path) -> None:
    result = _mypy(tmp_path, GOOD)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.timeout(_TIMEOUT * 2)
def test_typos_in_closed_sets_and_argument_names_fail_type_checking(tmp_path: Path) -> None:
    result = _mypy(tmp_path, BAD)
    assert result.returncode == 1, result.stdout + result.stderr
    errors = [line for line in result.stdout.splitlines() if ": error:" in line]
    lines = sorted({int(line.split(":")[1]) for line in errors})
    # One error per line of BAD that holds a mistake, and nothing else.
    assert lines == BAD_LINES, result.stdout


#: The lines of BAD that hold a mistake.
BAD_LINES = [6, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 26, 27, 28, 29, 30, 31, 32, 33]


def _pyright(tmp_path: Path, code: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "snippet.py").write_text(textwrap.dedent(code))
    config = {"typeCheckingMode": "strict", "pythonVersion": "3.11", "include": ["snippet.py"]}
    (tmp_path / "pyrightconfig.json").write_text(json.dumps(config))
    return subprocess.run(
        [sys.executable, "-m", "pyright", "--pythonpath", sys.executable, "--outputjson"],
        capture_output=True,
        text=True,
        timeout=_TIMEOUT,
        cwd=tmp_path,
        check=False,
    )


def _pyright_error_lines(result: subprocess.CompletedProcess[str]) -> list[int]:
    report = json.loads(result.stdout)
    # pyright counts lines from 0.
    return sorted(
        {
            d["range"]["start"]["line"] + 1
            for d in report["generalDiagnostics"]
            if d["severity"] == "error"
        }
    )


@pytest.mark.timeout(_TIMEOUT * 2)
def test_pyright_strict_accepts_typed_code(tmp_path: Path) -> None:
    result = _pyright(tmp_path, GOOD)
    assert _pyright_error_lines(result) == [], result.stdout
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.timeout(_TIMEOUT * 2)
def test_pyright_strict_finds_the_same_mistakes(tmp_path: Path) -> None:
    result = _pyright(tmp_path, BAD)
    assert _pyright_error_lines(result) == BAD_LINES, result.stdout
