"""``RetryPolicy`` (which failures are retried, the waits) and ``deadline`` (a bound on a call)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from asyncsearch import (
    APIStatusError,
    APITimeoutError,
    AsyncSearchClient,
    ConfigurationError,
    InternalServerError,
    InvalidRequestError,
    RetryBudget,
    RetryPolicy,
    _call,
)

from .conftest import API_KEY, JOB_ID, Server
from .helpers import TIME_SCALE
from .test_call_options import Serve

pytestmark = pytest.mark.timeout(30)

JOB = (Path(__file__).parent / "samples" / "extraction_job.json").read_bytes()


def scripted(*answers: tuple[int, dict[str, str]]) -> Any:
    """A handler giving ``answers`` in turn (status, headers), then 200 with a job."""
    queue = list(answers)

    async def handler(request: web.Request) -> web.StreamResponse:
        if queue:
            status, headers = queue.pop(0)
            return web.Response(status=status, headers=headers, text="no")
        return web.Response(body=JOB, content_type="application/json")

    return handler


@pytest.fixture
def slept(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The waits between attempts, recorded instead of slept."""
    delays: list[float] = []

    async def fake_sleep(delay: float) -> None:
        delays.append(delay)
        await asyncio.sleep(0)

    monkeypatch.setattr(_call, "_sleep", fake_sleep)
    return delays


def client_of(server: Server, **options: Any) -> AsyncSearchClient:
    return AsyncSearchClient(API_KEY, base_url=server.base_url, **options)


def test_the_default_policy_is_today_s_rules() -> None:
    policy = RetryPolicy()
    assert policy.max_retries == 2
    assert policy.statuses == frozenset({408, 429, *range(500, 600)})
    assert (policy.base, policy.cap, policy.jitter) == (0.5, 8.0, True)
    assert policy.max_retry_after == 60.0
    assert policy.retry_search == "safe"
    client = AsyncSearchClient(API_KEY, base_url="http://127.0.0.1:9")
    assert client._options.retry == policy
    assert client._options.deadline is None


def test_help_shows_the_default_statuses_in_one_line() -> None:
    """Issue 38: help(), signatures and repr() printed the default's 102 statuses one by one."""
    import inspect
    import pydoc

    import asyncsearch

    default = RetryPolicy().statuses
    assert isinstance(default, frozenset)
    assert default == frozenset({408, 429, *range(500, 600)})
    assert eval(repr(default)) == default  # the repr is valid Python for an equal set
    shown = "statuses=frozenset({408, 429, *range(500, 600)})"
    assert shown in repr(RetryPolicy())
    assert "= frozenset({408, 429, *range(500, 600)})" in str(inspect.signature(RetryPolicy))
    for page in (
        pydoc.render_doc(RetryPolicy, renderer=pydoc.plaintext),
        pydoc.render_doc(asyncsearch.AsyncSearchClient, renderer=pydoc.plaintext),
    ):
        assert "501, 502" not in page
    # A set of one's own is kept as given, with the plain repr.
    assert repr(RetryPolicy(statuses={503}).statuses) == "frozenset({503})"


def test_a_policy_is_frozen_and_checked() -> None:
    policy = RetryPolicy(statuses=[500, 503])
    assert policy.statuses == frozenset({500, 503})
    assert hash(policy) == hash(RetryPolicy(statuses={503, 500}))
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.max_retries = 5  # type: ignore[misc]
    for bad, name in [
        ({"max_retries": -1}, "max_retries"),
        ({"max_retries": 1.5}, "max_retries"),
        ({"statuses": "500"}, "statuses"),
        ({"statuses": [200, 99]}, "statuses"),
        ({"statuses": [True]}, "statuses"),
        ({"base": -1}, "base"),
        ({"cap": float("inf")}, "cap"),
        ({"max_retry_after": float("nan")}, "max_retry_after"),
        ({"jitter": 1}, "jitter"),
        ({"retry_search": "never"}, "retry_search"),
    ]:
        with pytest.raises(ConfigurationError, match=name):
            RetryPolicy(**bad)


def test_the_old_keywords_set_one_field_of_the_policy() -> None:
    base = RetryPolicy(max_retries=5, cap=1.0)
    client = AsyncSearchClient(API_KEY, base_url="http://127.0.0.1:9", retry=base, max_retries=0)
    assert client._options.retry == RetryPolicy(max_retries=0, cap=1.0)
    child = client.with_options(max_retry_after=3, retry_search="always")
    assert child._options.retry == RetryPolicy(
        max_retries=0, cap=1.0, max_retry_after=3, retry_search="always"
    )
    assert child.with_options(retry=RetryPolicy())._options.retry == RetryPolicy()
    # The shorthand wins whichever comes first.
    both = client.with_options(max_retries=1, retry=RetryPolicy(max_retries=5, cap=2.0))
    assert both._options.retry == RetryPolicy(max_retries=1, cap=2.0)
    with pytest.raises(ConfigurationError, match=r"retry must be an asyncsearch\.RetryPolicy"):
        client.with_options(retry=3)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="max_retries"):
        client.with_options(max_retries=-1)


async def test_a_status_outside_the_policy_is_not_retried_and_one_inside_is(
    serve: Serve, slept: list[float]
) -> None:
    server = await serve(scripted((500, {})))
    async with client_of(server, retry=RetryPolicy(statuses={503})) as client:
        with pytest.raises(InternalServerError):
            await client.get_extraction(JOB_ID)
    assert len(server.seen) == 1

    server = await serve(scripted((418, {}), (418, {})))
    async with client_of(server) as client:
        with pytest.raises(APIStatusError) as caught:
            await client.get_extraction(JOB_ID)
        assert caught.value.status_code == 418
        assert len(server.seen) == 1  # not in the default list
        job = await client.get_extraction(JOB_ID, retry=RetryPolicy(statuses={418}))
    assert job.id == JOB_ID
    assert len(server.seen) == 3


async def test_the_safe_post_rule_narrows_the_policy_s_statuses(
    serve: Serve, slept: list[float]
) -> None:
    server = await serve(scripted((500, {}), (500, {})))
    async with client_of(server) as client:
        with pytest.raises(InternalServerError):
            await client.search("q")  # not incognito: a 500 may follow a recorded search
        assert len(server.seen) == 1
        always = RetryPolicy(retry_search="always")
        response = await client.with_raw_response.search("q", retry=always)
    # The second 500 and the success (a job's body: not parsed here): retried like a GET.
    assert (response.status_code, response.attempts) == (200, 2)
    assert len(server.seen) == 3


async def test_cap_and_jitter_bound_the_waits(serve: Serve, slept: list[float]) -> None:
    always_500 = scripted(*[(500, {})] * 20)
    server = await serve(always_500)
    fixed = RetryPolicy(max_retries=4, base=1.0, cap=2.5, jitter=False)
    async with client_of(server, retry=fixed) as client:
        with pytest.raises(InternalServerError):
            await client.get_extraction(JOB_ID)
        assert slept == [1.0, 2.0, 2.5, 2.5]
        slept.clear()
        jittered = dataclasses.replace(fixed, jitter=True, max_retries=6)
        with pytest.raises(InternalServerError):
            await client.get_extraction(JOB_ID, retry=jittered)
    assert len(slept) == 6
    ceilings = [min(2.5, 1.0 * 2 ** (n - 1)) for n in range(1, 7)]
    assert all(0 <= wait <= ceiling for wait, ceiling in zip(slept, ceilings, strict=True))
    assert slept != ceilings  # drawn, not the ceilings themselves


async def test_retry_after_ms_is_honoured_up_to_max_retry_after(
    serve: Serve, slept: list[float]
) -> None:
    server = await serve(scripted((503, {"retry-after-ms": "250", "Retry-After": "7"})))
    async with client_of(server) as client:
        assert (await client.get_extraction(JOB_ID)).id == JOB_ID
    assert slept == [0.25]  # retry-after-ms wins over Retry-After

    server = await serve(scripted((429, {"retry-after-ms": "2500"})))
    async with client_of(server, retry=RetryPolicy(max_retry_after=2)) as client:
        with pytest.raises(APIStatusError) as caught:
            await client.get_extraction(JOB_ID)
    assert caught.value.status_code == 429
    assert len(server.seen) == 1  # asked for longer than the policy waits: raised at once
    # max_retries allowed more: the error says what stopped them.
    assert caught.value.retries_stopped == (
        "the server asked to wait 2.5s, more than max_retry_after=2s"
    )
    assert "not retried: the server asked to wait 2.5s" in str(caught.value)


@pytest.mark.parametrize(
    ("answer", "options"),
    [
        ((404, {}), {}),  # not a retryable failure
        ((429, {"Retry-After": "5"}), {"max_retries": 0, "max_retry_after": 1}),  # none allowed
        ((503, {}), {"max_retries": 1}),  # every retry allowed was made
    ],
    ids=["404", "no retries allowed", "retries used up"],
)
async def test_retries_stopped_is_none_when_nothing_cut_the_retries_short(
    serve: Serve, slept: list[float], answer: tuple[int, dict[str, str]], options: dict[str, Any]
) -> None:
    server = await serve(scripted(answer, answer))
    async with client_of(server, **options) as client:
        with pytest.raises(APIStatusError) as caught:
            await client.get_extraction(JOB_ID)
    assert caught.value.status_code == answer[0]
    assert caught.value.retries_stopped is None


# -- deadline --------------------------------------------------------------------------------


async def test_a_deadline_stops_the_retries_whose_wait_would_pass_it(serve: Serve) -> None:
    """The issue's case: 1.2 s against a 503 with Retry-After 0.5, slept for real."""

    async def handler(request: web.Request) -> web.StreamResponse:
        return web.Response(status=503, headers={"Retry-After": "0.5"}, text="busy")

    server = await serve(handler)
    budget = RetryBudget()
    async with client_of(server, retry=RetryPolicy(max_retries=10), retry_budget=budget) as client:
        started = time.monotonic()
        with pytest.raises(APIStatusError) as caught:
            await client.get_extraction(JOB_ID, deadline=1.2)
        elapsed = time.monotonic() - started
    assert caught.value.status_code == 503
    assert elapsed < 1.5 * TIME_SCALE
    assert 1 <= len(server.seen) <= 3
    assert caught.value.attempts == len(server.seen)
    stopped = caught.value.retries_stopped
    assert stopped is not None
    assert "deadline of 1.2s" in stopped
    assert "deadline" in str(caught.value)
    # Only the retries made were charged: the one the deadline stopped was not.
    assert budget.tokens == budget.capacity - 5 * (len(server.seen) - 1)


async def test_an_attempt_cut_short_by_the_deadline_is_a_timeout_not_retried(
    serve: Serve, slept: list[float]
) -> None:
    never = asyncio.Event()  # the server never answers: the deadline ends the attempt

    async def handler(request: web.Request) -> web.StreamResponse:
        await never.wait()
        raise AssertionError("unreachable")

    server = await serve(handler)
    async with client_of(server, deadline=0.3, max_retries=5) as client:
        with pytest.raises(APITimeoutError, match=r"deadline of 0\.3s") as caught:
            await client.get_extraction(JOB_ID)
    assert caught.value.attempts == 1
    assert caught.value.retryable is False  # the deadline has passed: nothing may follow
    assert len(server.seen) == 1
    assert slept == []


async def test_a_deadline_with_room_left_changes_nothing(serve: Serve, slept: list[float]) -> None:
    server = await serve(scripted((503, {}), (503, {})))
    async with client_of(server) as client:
        short = client.with_options(deadline=60)
        response = await short.with_raw_response.get_extraction(JOB_ID)
    assert response.attempts == 3
    assert len(slept) == 2


def test_deadline_is_checked() -> None:
    client = AsyncSearchClient(API_KEY, base_url="http://127.0.0.1:9", deadline=5)
    assert client._options.deadline == 5
    assert client.with_options(deadline=None)._options.deadline is None
    for bad in (0, -1, float("inf"), "5", True):
        with pytest.raises(ConfigurationError, match="deadline"):
            client.with_options(deadline=bad)  # type: ignore[arg-type]


async def test_a_bad_deadline_of_a_call_is_refused_before_sending(serve: Serve) -> None:
    server = await serve(scripted())
    async with client_of(server) as client:
        with pytest.raises(InvalidRequestError, match="deadline"):
            await client.get_extraction(JOB_ID, deadline=0)
        with pytest.raises(InvalidRequestError, match="retry must be"):
            await client.get_extraction(JOB_ID, retry={"max_retries": 1})  # type: ignore[typeddict-item]
    assert server.seen == []


def test_the_sample_job_is_what_the_handlers_send() -> None:
    assert json.loads(JOB)["id"] == JOB_ID


async def test_a_pager_s_deadline_bounds_each_page_not_the_walk(serve: Serve) -> None:
    """Each page waits out one Retry-After well within the deadline; the walk runs past it."""
    page = json.loads((Path(__file__).parent / "samples" / "search_page.json").read_bytes())
    wait = 0.3 * TIME_SCALE
    asked: set[int] = set()

    async def handler(request: web.Request) -> web.StreamResponse:
        number = (await request.json())["pagination"]["page"]
        if number not in asked:  # each page's first request: come back later
            asked.add(number)
            return web.Response(status=503, headers={"Retry-After": f"{wait:.3f}"})
        hit = {**page["hits"][0], "id": f"{number:08d}-5b7d-4c1e-9a2b-7d8e9f0a1b2c"}
        body = {**page, "hits": [hit], "hasMore": number < 4}
        return web.Response(body=json.dumps(body), content_type="application/json")

    server = await serve(handler)
    async with client_of(server) as client:
        started = time.monotonic()
        pages = [p async for p in client.search_pages("q", incognito=True, deadline=3 * wait)]
        elapsed = time.monotonic() - started
    assert len(pages) == 4
    assert len(server.seen) == 8
    assert elapsed > 3 * wait  # the walk took longer than one page's deadline
