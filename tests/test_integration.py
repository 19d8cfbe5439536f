"""The SDK against the bundled emulator over real loopback HTTP: endpoints, paging, bulk, faults.

The emulator writes the wire format from the spec on its own, so these tests catch decoding
mistakes that a test server built from the SDK's own models would hide.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

import asyncsearch
from asyncsearch import (
    APIConnectionError,
    APITimeoutError,
    AsyncSearchClient,
    AuthenticationError,
    InternalServerError,
    NotFoundError,
    RateLimitError,
    Timeout,
    UnprocessableEntityError,
    _call,
)
from asyncsearch.testing import ServiceEmulator, fake_image_data_url

pytestmark = pytest.mark.timeout(60)

KEY = "integration-key"


@pytest_asyncio.fixture
async def emu() -> AsyncIterator[ServiceEmulator]:
    async with ServiceEmulator(api_key=KEY, seed=11, n_resources=120, n_jobs=40) as emulator:
        yield emulator


@pytest_asyncio.fixture
async def client(emu: ServiceEmulator) -> AsyncIterator[AsyncSearchClient]:
    async with AsyncSearchClient(emu.api_key, base_url=emu.base_url) as c:
        yield c


@pytest.fixture
def fast_backoff(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    delays: list[float] = []

    async def record(delay: float) -> None:
        delays.append(delay)
        await asyncio.sleep(0)

    monkeypatch.setattr(_call, "_sleep", record)
    return delays


# -- every endpoint -------------------------------------------------------------------------------


async def test_text_search_decodes_every_seeded_field(client: AsyncSearchClient) -> None:
    page = await client.search("invoice payment", page_size=50, precision=0)
    assert page.total > 0
    assert page.hits
    for hit in page.hits:
        assert isinstance(hit, asyncsearch.SearchHit)
        assert hit.score is not None
        assert 0 <= hit.score <= 1
        assert hit.embeddings is not None
        assert len(hit.embeddings.small3_512) == 512
        assert len(hit.embeddings.clip2) == 768
        assert hit.user is not None
        assert hit.root is not None
        assert hit.data is not None
        assert hit.thumbnail is not None
    assert [h.score for h in page.hits] == sorted((h.score or 0 for h in page.hits), reverse=True)
    assert any(hit.chunks for hit in page.hits)


async def test_image_resource_and_multi_query_search(
    client: AsyncSearchClient, emu: ServiceEmulator
) -> None:
    by_image = await client.search(image=fake_image_data_url("guitar concert"), precision=0)
    assert by_image.hits
    some_id = emu.resources()[0]["id"]
    similar = await client.search(resource_id=some_id, precision=0)
    assert some_id not in {h.id for h in similar.hits}
    multi = await client.search(queries=[{"text": "harbor"}, {"text": "guitar"}], precision=0)
    assert multi.total >= max(
        (await client.search("harbor", precision=0)).total,
        (await client.search("guitar", precision=0)).total,
    )


async def test_filters_sort_and_incognito_reach_the_service(
    client: AsyncSearchClient, emu: ServiceEmulator
) -> None:
    kind = emu.resources()[0]["kind"]
    page = await client.search(
        filters={"kinds": [kind]}, sort={"field": "name", "order": "asc"}, page_size=100
    )
    assert page.hits
    assert {h.kind for h in page.hits} == {kind}
    names = [h.name for h in page.hits if h.name is not None]
    assert names == sorted(names, key=str.lower)
    before = len(emu.search_history)
    await client.search("secret plans", incognito=True)
    assert len(emu.search_history) == before


async def test_extraction_in_both_formats(client: AsyncSearchClient, emu: ServiceEmulator) -> None:
    job_id = emu.jobs()[0]["id"]
    job = await client.get_extraction(job_id)
    markdown = await client.get_extraction(job_id, format="markdown")
    assert job.id == markdown.id == job_id
    assert job.created_at is not None
    assert job.created_at.tzinfo is not None
    assert markdown.extraction is not None
    assert markdown.extraction.common is not None
    assert (markdown.extraction.common.caption or "").startswith("# ")


async def test_link_preview_and_webhook_logs(
    client: AsyncSearchClient, emu: ServiceEmulator
) -> None:
    preview = await client.link_preview(emu.page_urls[0], type="link")
    assert preview.url == emu.page_urls[0]
    assert preview.title
    assert isinstance(preview.metadata, dict)
    job_id = next(j["id"] for j in emu.jobs() if emu.webhook_logs(j["id"]))
    logs = await client.list_webhook_logs(job_id)
    assert [log.id for log in logs] == [log["id"] for log in emu.webhook_logs(job_id)]
    detail = await client.get_webhook_log(job_id, logs[-1].id)
    assert detail.id == logs[-1].id
    assert detail.created_at is not None


async def test_bases_are_separate(client: AsyncSearchClient, emu: ServiceEmulator) -> None:
    emu.add_resource(name="Only in the base", base_id="base-a", text="zebra crossing lights")
    in_base = await client.with_options(base_id="base-a").search("zebra", precision=0)
    in_workspace = await client.search("zebra", precision=0)
    assert [h.name for h in in_base.hits] == ["Only in the base"]
    assert "Only in the base" not in {h.name for h in in_workspace.hits}


# -- paging and bulk ------------------------------------------------------------------------------


async def test_browsing_every_page_yields_every_resource_once(
    client: AsyncSearchClient, emu: ServiceEmulator
) -> None:
    pager = client.search_hits(filters={"kinds": []}, page_size=7)
    ids = [hit.id async for hit in pager]
    assert len(ids) == len(set(ids)) == len(emu.resources())
    assert pager.total == len(emu.resources())
    assert pager.next_page is None


async def test_zero_based_paging(emu: ServiceEmulator) -> None:
    async with (
        ServiceEmulator(api_key=KEY, seed=2, n_resources=30, first_page=0) as zero,
        AsyncSearchClient(KEY, base_url=zero.base_url, first_page=0) as client,
    ):
        ids = [h.id async for h in client.search_hits(filters={}, page_size=10)]
    assert len(set(ids)) == 30


async def test_bulk_fetch_under_faults_loses_nothing(
    client: AsyncSearchClient, emu: ServiceEmulator, fast_backoff: list[float]
) -> None:
    ids = [job["id"] for job in emu.jobs()]
    unknown = [str(uuid.uuid4()) for _ in range(3)]
    emu.faults.set("extract", rate_503=0.15, rate_500=0.05, rate_429=0.05, retry_after=0)
    retrying = client.with_options(max_retries=6)
    results = await retrying.gather_extractions([*ids, *unknown], concurrency=8)
    assert [r.job_id for r in results] == [*ids, *unknown]
    assert all(r.ok for r in results[: len(ids)])
    assert all(isinstance(r.error, NotFoundError) for r in results[len(ids) :])
    assert emu.stats.max_in_flight_by_endpoint["extract"] <= 8
    assert fast_backoff, "the injected faults were retried"


async def test_wait_for_extraction_follows_the_job(
    client: AsyncSearchClient, emu: ServiceEmulator, fast_backoff: list[float]
) -> None:
    job = emu.add_job(state="pending", next_states=["processing", "done"])
    done = await client.wait_for_extraction(job["id"], until=lambda j: j.state == "done")
    assert done.state == "done"


# -- errors and faults ----------------------------------------------------------------------------


async def test_error_paths(emu: ServiceEmulator, client: AsyncSearchClient) -> None:
    async with AsyncSearchClient("wrong-key", base_url=emu.base_url) as bad:
        with pytest.raises(AuthenticationError) as info:
            await bad.search("x")
    assert "wrong-key" not in str(info.value)
    with pytest.raises(NotFoundError):
        await client.get_extraction(str(uuid.uuid4()))
    with pytest.raises(NotFoundError):
        await client.list_webhook_logs(str(uuid.uuid4()))
    with pytest.raises(NotFoundError):
        await client.get_webhook_log(emu.jobs()[0]["id"], str(uuid.uuid4()))
    # Past limits the client cannot know: the service's own answer is typed. The emulator
    # refuses these only in its strict mode (the spec leaves them open).
    async with (
        ServiceEmulator(api_key=KEY, seed=11, n_resources=20, n_jobs=0, strict=True) as strict,
        AsyncSearchClient(strict.api_key, base_url=strict.base_url) as strict_client,
    ):
        with pytest.raises(UnprocessableEntityError) as unprocessable:
            await strict_client.search("x", page_size=1000)
        assert unprocessable.value.body["error"]["field"] == "pagination.pageSize"
        with pytest.raises(UnprocessableEntityError):
            await strict_client.search("x", sort={"field": "colour"})


@pytest.mark.parametrize(
    ("fault", "error", "attempts"),
    [
        (500, InternalServerError, 3),
        (503, InternalServerError, 3),
        ("drop", APIConnectionError, 3),
        ("truncate", APIConnectionError, 3),
    ],
)
async def test_persistent_faults_are_retried_then_raised(
    client: AsyncSearchClient,
    emu: ServiceEmulator,
    fast_backoff: list[float],
    fault: int | str,
    error: type[Exception],
    attempts: int,
) -> None:
    emu.faults.script("extract", [fault] * attempts)
    with pytest.raises(error) as info:
        await client.get_extraction(emu.jobs()[0]["id"])
    assert getattr(info.value, "attempts", None) == attempts
    assert emu.stats.counts["extract"] == attempts


@pytest.mark.parametrize("fault", [500, 503, 429, "drop", "truncate", "slow"])
async def test_one_fault_then_success(
    client: AsyncSearchClient, emu: ServiceEmulator, fast_backoff: list[float], fault: int | str
) -> None:
    emu.faults.set("*", retry_after=0)
    emu.faults.script("search", [fault, "ok"])
    # incognito: a search that leaves no history entry may be sent again after any failure.
    page = await client.search("invoice", incognito=True)
    assert page.total >= 0
    expected = 1 if fault == "slow" else 2  # a slow body is still a good answer
    assert emu.stats.counts["search"] == expected
    assert list(emu.search_history) == []


@pytest.mark.parametrize(
    ("fault", "retried"),
    [
        (429, True),  # refused for its rate: not acted on
        (503, True),  # the service could not take it: not acted on
        (500, False),  # the service may have recorded it before failing
        ("drop", False),  # the body was sent: the service may have acted on it
        ("truncate", False),  # answered (and recorded), then the body was cut
    ],
)
async def test_a_search_with_history_is_not_sent_twice(
    client: AsyncSearchClient,
    emu: ServiceEmulator,
    fast_backoff: list[float],
    fault: int | str,
    retried: bool,
) -> None:
    emu.faults.set("*", retry_after=0)
    emu.faults.script("search", [fault, "ok"])
    if retried:
        await client.search("invoice")
    else:
        with pytest.raises((InternalServerError, APIConnectionError)) as info:
            await client.search("invoice")
        assert info.value.attempts == 1
    assert emu.stats.counts["search"] == (2 if retried else 1)
    # Never two history entries for one call (the truncated answer was recorded once).
    assert len(emu.search_history) == (1 if retried or fault == "truncate" else 0)


async def test_retry_search_always_retries_a_search_with_history(
    emu: ServiceEmulator, fast_backoff: list[float]
) -> None:
    emu.faults.script("search", ["truncate", "ok"])
    async with AsyncSearchClient(KEY, base_url=emu.base_url, retry_search="always") as client:
        page = await client.search("invoice")
    assert page.total >= 0
    assert emu.stats.counts["search"] == 2
    assert len(emu.search_history) == 2  # the price of "always", as documented


async def test_rate_limit_with_long_retry_after_is_raised(
    client: AsyncSearchClient, emu: ServiceEmulator, fast_backoff: list[float]
) -> None:
    emu.faults.set("link", rate_429=1.0, retry_after=3600)
    with pytest.raises(RateLimitError) as info:
        await client.link_preview(emu.page_urls[0])
    assert info.value.retry_after == 3600
    assert fast_backoff == []


async def test_an_answer_held_past_the_read_timeout(emu: ServiceEmulator) -> None:
    # Held at the gate until the client gave up: no bet on a latency outlasting a timeout.
    emu.faults.hold("webhook_logs")
    try:
        async with AsyncSearchClient(
            KEY, base_url=emu.base_url, timeout=Timeout(read=0.1), max_retries=1
        ) as client:
            with pytest.raises(APITimeoutError) as info:
                async with asyncio.timeout(10):
                    await client.list_webhook_logs(emu.jobs()[0]["id"])
    finally:
        emu.faults.release()
    assert info.value.attempts == 2
    assert emu.stats.count("webhook_logs") == 2


async def test_lean_search_skips_embeddings_everywhere(client: AsyncSearchClient) -> None:
    full = await client.search("invoice", precision=0)
    lean = await client.search("invoice", precision=0, embeddings=False)
    assert type(lean) is asyncsearch.SearchPage
    assert [h.id for h in lean.hits] == [h.id for h in full.hits]
    assert all(h.embeddings is None for h in lean.hits)
    assert all(h.embeddings is not None for h in full.hits)
    hits = [h async for h in client.search_hits("invoice", embeddings=False, max_items=30)]
    assert hits
    assert all(type(h) is asyncsearch.SearchHit and h.embeddings is None for h in hits)
    pages = [p async for p in client.search_pages("invoice", embeddings=False, max_pages=2)]
    assert all(h.embeddings is None for p in pages for h in p.hits)
    matrix = full.embedding_matrix("clip2")
    assert matrix.shape == (len(full.hits), 768)
