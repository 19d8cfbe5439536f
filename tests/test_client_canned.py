"""Canned answers through aioresponses: decoding and error mapping where no socket is needed.

These run only on the aiohttp range aioresponses supports (see the ``dev`` extra); everything
that depends on real socket behaviour is in test_client.py.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from aioresponses import aioresponses
from yarl import URL

import asyncsearch
from asyncsearch import AsyncSearchClient, _call

from .conftest import API_KEY, JOB_ID, LOG_ID

pytestmark = [pytest.mark.aioresponses, pytest.mark.timeout(20)]

BASE = "https://api.example.com/prefix"
SAMPLES = Path(__file__).parent / "samples"


@pytest.fixture
def mocked() -> Iterator[aioresponses]:
    with aioresponses() as mock:
        yield mock


@pytest_asyncio.fixture
async def client(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[AsyncSearchClient]:
    async def no_sleep(delay: float) -> None:
        await asyncio.sleep(0)

    monkeypatch.setattr(_call, "_sleep", no_sleep)
    async with AsyncSearchClient(API_KEY, base_url=BASE + "/") as c:
        yield c


def canned(name: str) -> Any:
    return json.loads((SAMPLES / name).read_text())


def sent(mock: aioresponses, method: str, url: str) -> list[Any]:
    return mock.requests[(method, URL(url))]


async def test_search_page_decodes(mocked: aioresponses, client: AsyncSearchClient) -> None:
    mocked.post(f"{BASE}/v2/search", payload=canned("search_page.json"))
    page = await client.search("report", incognito=True)
    assert page.total == 42
    assert page.has_more is True
    hit = page.hits[0]
    assert hit.tags[0].name == "finance"
    assert hit.chunks[0].page_number == 2
    (call,) = sent(mocked, "POST", f"{BASE}/v2/search")
    assert json.loads(call.kwargs["data"]) == {"text": "report", "incognito": True}
    assert call.kwargs["headers"]["X-Api-Key"] == API_KEY


async def test_extraction_and_webhooks_decode(
    mocked: aioresponses, client: AsyncSearchClient
) -> None:
    mocked.get(f"{BASE}/v2/extract/{JOB_ID}?format=json", payload=canned("extraction_job.json"))
    mocked.get(f"{BASE}/v2/extract/{JOB_ID}/webhook-logs", payload=canned("webhook_logs.json"))
    mocked.get(
        f"{BASE}/v2/extract/{JOB_ID}/webhook-logs/{LOG_ID}", payload=canned("webhook_log.json")
    )
    job = await client.get_extraction(JOB_ID, format="json")
    assert job.extraction is not None
    assert job.extraction.common is not None
    assert job.extraction.common.chunk_count == 12
    logs = await client.list_webhook_logs(JOB_ID)
    assert [log.attempt_number for log in logs] == [2]
    log = await client.get_webhook_log(JOB_ID, LOG_ID)
    assert log.status_code == 502
    assert log.request_payload == {"event": "extraction.done"}


async def test_link_preview_decodes(mocked: aioresponses, client: AsyncSearchClient) -> None:
    mocked.get(
        f"{BASE}/v2/link?url=https%3A%2F%2Fexample.com%2Fpost", payload=canned("link_preview.json")
    )
    preview = await client.link_preview("https://example.com/post")
    assert preview.site_name == "Example"
    assert preview.image is not None
    assert preview.image.width == 640


async def test_not_found_is_typed(mocked: aioresponses, client: AsyncSearchClient) -> None:
    mocked.get(f"{BASE}/v2/extract/{JOB_ID}", status=404, payload={"message": "no such job"})
    with pytest.raises(asyncsearch.NotFoundError, match="no such job") as info:
        await client.get_extraction(JOB_ID)
    assert info.value.attempts == 1
    assert info.value.body == {"message": "no such job"}


async def test_rate_limit_then_success(mocked: aioresponses, client: AsyncSearchClient) -> None:
    url = f"{BASE}/v2/extract/{JOB_ID}/webhook-logs"
    mocked.get(url, status=429, headers={"Retry-After": "0"})
    mocked.get(url, payload={"items": []})
    assert await client.list_webhook_logs(JOB_ID) == []
    assert len(sent(mocked, "GET", url)) == 2


async def test_wrong_schema_is_a_validation_error(
    mocked: aioresponses, client: AsyncSearchClient
) -> None:
    mocked.get(f"{BASE}/v2/extract/{JOB_ID}", payload={"id": 5})
    with pytest.raises(asyncsearch.ResponseValidationError) as info:
        await client.get_extraction(JOB_ID)
    assert info.value.path == "$.id"
