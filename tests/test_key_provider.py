"""``api_key=`` a function: asked before each call, once more after a 401, and never shown."""

from __future__ import annotations

import asyncio
import logging
import traceback
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web

from asyncsearch import (
    APITimeoutError,
    AsyncSearchClient,
    AuthenticationError,
    ConfigurationError,
    ExtractionFailure,
    KeyProviderError,
    RateLimit,
    RetryBudget,
    _call,
)

from .conftest import API_KEY, JOB_ID, Handler, Server
from .helpers import TIME_SCALE, turns
from .test_call_options import ANSWERS
from .test_security import everything_about
from .test_tracing import _provider, spans  # noqa: F401  (the tracing tests' span exporter)

Serve = Callable[[Handler], Awaitable[Server]]

pytestmark = pytest.mark.timeout(30)

BOUND = 10.0 * TIME_SCALE
IDS = [f"00000000-0000-4000-8000-{n:012d}" for n in range(200)]


@pytest.fixture(autouse=True)
def no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    async def fake_sleep(delay: float) -> None:
        await asyncio.sleep(0)

    monkeypatch.setattr(_call, "_sleep", fake_sleep)


class Provider:
    """A rotating key: each question gets a new one (``<API_KEY>-1``, ``-2``, ...), sync or
    async. Each holds ``API_KEY``, so the suite's log guard (conftest) looks for every one."""

    def __init__(self, *, is_async: bool) -> None:
        self.is_async = is_async
        self.asks = 0

    def _next(self) -> str:
        self.asks += 1
        return f"{API_KEY}-{self.asks}"

    def __call__(self) -> Any:
        if not self.is_async:
            return self._next()

        async def ask() -> str:
            await asyncio.sleep(0)
            return self._next()

        return ask()


def keys_service(refused: Callable[[str], bool]) -> Handler:
    """A job for a key not ``refused``; else a 401 echoing the key in its body and a header."""

    async def handler(request: web.Request) -> web.StreamResponse:
        key = request.headers.get("X-Api-Key", "")
        if refused(key):
            body = {"message": f"bad key {key}"}
            return web.json_response(body, status=401, headers={"X-Echo": key})
        return web.Response(body=ANSWERS["extract"], content_type="application/json")

    return handler


def sent_keys(server: Server) -> list[str]:
    return [seen.headers["X-Api-Key"] for seen in server.seen]


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
async def test_a_provider_is_asked_before_each_call(serve: Serve, is_async: bool) -> None:
    provider = Provider(is_async=is_async)
    server = await serve(keys_service(lambda key: False))
    async with AsyncSearchClient(provider, base_url=server.base_url) as client:
        await client.get_extraction(JOB_ID)
        await client.with_options(max_retries=0).get_extraction(JOB_ID)
    assert sent_keys(server) == [f"{API_KEY}-1", f"{API_KEY}-2"]
    assert provider.asks == 2


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
async def test_a_401_asks_the_provider_once_more_and_the_call_is_retried_once(
    serve: Serve, is_async: bool
) -> None:
    provider = Provider(is_async=is_async)
    server = await serve(keys_service(lambda key: key.endswith("-1")))
    # Neither max_retries=0 nor an empty retry budget stops the attempt with the new key.
    options: dict[str, Any] = {"max_retries": 0, "retry_budget": RetryBudget(capacity=0)}
    async with AsyncSearchClient(provider, base_url=server.base_url, **options) as client:
        response = await client.with_raw_response.get_extraction(JOB_ID)
        assert response.attempts == 2
        # The next call asks again, and keeps the key through its retries.
        await client.get_extraction(JOB_ID)
    assert sent_keys(server) == [f"{API_KEY}-1", f"{API_KEY}-2", f"{API_KEY}-3"]
    assert provider.asks == 3


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
async def test_a_second_401_raises_and_nothing_shows_a_key(
    serve: Serve,
    is_async: bool,
    caplog: pytest.LogCaptureFixture,
    spans: Any,  # noqa: F811  (the fixture imported above)
) -> None:
    caplog.set_level(logging.DEBUG)  # the root logger: asyncsearch, aiohttp and asyncio
    provider = Provider(is_async=is_async)
    server = await serve(keys_service(lambda key: True))
    async with AsyncSearchClient(provider, base_url=server.base_url, max_retries=3) as client:
        with pytest.raises(AuthenticationError) as caught:
            await client.get_extraction(JOB_ID)
        texts = [repr(client), repr(vars(client)), repr(client.with_options(max_retries=1))]
    error = caught.value
    assert sent_keys(server) == [f"{API_KEY}-1", f"{API_KEY}-2"]  # no retry after the second
    assert provider.asks == 2
    assert error.attempts == 2
    assert "[redacted]" in str(error.body)
    assert error.headers["X-Echo"] == "[redacted]"
    texts += [everything_about(error), "".join(traceback.format_exception(error)), caplog.text]
    finished = spans()
    assert finished, "no span was recorded"
    texts += [repr(span.to_json()) for span in finished]
    assert [text for text in texts if API_KEY in text] == []


async def test_the_attempt_with_the_new_key_leaves_every_retry_to_the_call(serve: Serve) -> None:
    """max_retries=1: a 401, the new key's attempt, a 500, and the one retry still comes."""
    provider = Provider(is_async=False)
    refuse = keys_service(lambda key: key.endswith("-1"))
    answered: list[int] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        response = await refuse(request)
        if response.status == 200 and 500 not in answered:
            response = web.json_response({"message": "oops"}, status=500)
        answered.append(response.status)
        return response

    server = await serve(handler)
    async with AsyncSearchClient(provider, base_url=server.base_url, max_retries=1) as client:
        response = await client.with_raw_response.get_extraction(JOB_ID)
    assert answered == [401, 500, 200]
    assert response.attempts == 3
    assert provider.asks == 2  # a retry after a 500 keeps the call's key


async def test_a_string_key_is_not_retried_after_a_401(serve: Serve) -> None:
    server = await serve(keys_service(lambda key: True))
    async with AsyncSearchClient(API_KEY, base_url=server.base_url) as client:
        with pytest.raises(AuthenticationError):
            await client.get_extraction(JOB_ID)
    assert sent_keys(server) == [API_KEY]


async def test_a_401_storm_in_a_bulk_call_asks_the_provider_once(serve: Serve) -> None:
    """200 ids, all refused, 8 at a time: the bulk call asks for its key once (its first id;
    every other id takes the answer given since the call began), and the storm of 401s asks
    once more (the call holding that key asks; the others retry with the new one): 2
    questions, 2 requests per call in flight, none for the rest."""
    concurrency = 8
    provider = Provider(is_async=False)
    arrived = asyncio.Event()
    refuse = keys_service(lambda key: True)

    async def handler(request: web.Request) -> web.StreamResponse:
        # The first answer waits for every call in flight to have sent its first request.
        if len(server.seen) >= concurrency:
            arrived.set()
        await arrived.wait()
        return await refuse(request)

    server = await serve(handler)
    async with AsyncSearchClient(provider, base_url=server.base_url) as client:
        async with asyncio.timeout(BOUND):
            results = await client.gather_extractions(IDS, concurrency=concurrency)
    assert all(isinstance(r, ExtractionFailure) for r in results)
    assert all(isinstance(r.error, AuthenticationError) for r in results)
    assert provider.asks == 2
    assert len(server.seen) == 2 * concurrency
    assert sent_keys(server)[:concurrency] == [f"{API_KEY}-1"] * concurrency
    # Every second request sent the one key the refresh got.
    assert sent_keys(server)[concurrency:] == [f"{API_KEY}-2"] * concurrency


async def test_a_401_storm_under_a_rate_limit_asks_the_provider_once(serve: Serve) -> None:
    """Attempts spread out by a rate limit: the calls in flight ask for their first key
    together, before they wait for a connection and a token, so they share one question to the
    async provider; the storm of 401s then asks once more, one question for all of them."""
    concurrency = 8
    provider = Provider(is_async=True)
    server = await serve(keys_service(lambda key: True))
    limit = RateLimit(per_second=100, burst=1)
    options: dict[str, Any] = {"rate_limit": limit}
    async with AsyncSearchClient(provider, base_url=server.base_url, **options) as client:
        async with asyncio.timeout(BOUND):
            results = await client.gather_extractions(IDS, concurrency=concurrency)
    assert all(isinstance(r.error, AuthenticationError) for r in results)
    assert provider.asks == 2
    assert len(server.seen) == 2 * concurrency


async def test_with_options_takes_a_key_or_a_provider(serve: Serve) -> None:
    server = await serve(keys_service(lambda key: False))
    async with AsyncSearchClient("plain-key", base_url=server.base_url) as client:
        await client.with_options(api_key=lambda: "from-a-sync-provider").get_extraction(JOB_ID)

        async def provider() -> str:
            return "from-an-async-provider"

        derived = client.with_options(api_key=provider)
        await derived.get_extraction(JOB_ID)
        await derived.with_options(api_key="plain-again").get_extraction(JOB_ID)
        await client.get_extraction(JOB_ID)
    assert sent_keys(server) == [
        "from-a-sync-provider",
        "from-an-async-provider",
        "plain-again",
        "plain-key",
    ]


@pytest.mark.parametrize("bad", ["", "sk-secret\n", "sk-secret\x00", None, 42])
async def test_a_bad_key_from_a_provider_is_refused_without_quoting_it(
    serve: Serve, bad: object
) -> None:
    server = await serve(keys_service(lambda key: False))
    async with AsyncSearchClient(lambda: bad, base_url=server.base_url) as client:
        with pytest.raises(ConfigurationError, match="the api_key provider returned") as caught:
            await client.get_extraction(JOB_ID)
    assert "sk-secret" not in str(caught.value)
    assert "42" not in str(caught.value)
    assert server.seen == []


async def test_a_provider_that_fails_fails_the_call_before_anything_is_sent(serve: Serve) -> None:
    server = await serve(keys_service(lambda key: False))

    def provider() -> str:
        raise LookupError("the vault is sealed")

    async with AsyncSearchClient(provider, base_url=server.base_url) as client:
        with pytest.raises(LookupError, match="vault"):
            await client.get_extraction(JOB_ID)
    assert server.seen == []


# -- issue 45: a provider's failure is the provider's; one question at a time ------------------


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
async def test_a_failing_provider_stops_a_bulk_call_and_is_asked_once(
    serve: Serve, is_async: bool
) -> None:
    """Before: each id failed with "a middleware raised KeyError" and the provider was asked
    again for every id (200 times). Now each id's error names the provider, the first failure
    stops the call like a 401, and nothing more is asked or sent."""
    server = await serve(keys_service(lambda key: False))
    asks = 0

    def failing() -> str:
        nonlocal asks
        asks += 1
        raise KeyError("the vault is sealed")

    async def failing_async() -> str:
        await asyncio.sleep(0)
        return failing()

    provider = failing_async if is_async else failing
    async with AsyncSearchClient(provider, base_url=server.base_url) as client:
        async with asyncio.timeout(BOUND):
            results = await client.gather_extractions(IDS, concurrency=16)
    assert asks == 1
    assert server.seen == []
    assert len(results) == len(IDS)
    errors = [result.error for result in results]
    assert all(isinstance(error, KeyProviderError) for error in errors)
    asked = [error for error in errors if isinstance(error.__cause__, KeyError)]
    assert asked, "no id's error has the provider's error as its cause"
    assert all("the api_key provider raised KeyError" in str(error) for error in asked)
    assert all("middleware" not in str(error) for error in errors)
    not_sent = [error for error in errors if error not in asked]
    assert all(str(error).startswith("not sent") for error in not_sent)
    assert len(not_sent) >= len(IDS) - 16


async def test_a_call_cut_off_while_the_provider_answers_spends_no_token(serve: Serve) -> None:
    """Before: the token was taken first, then the deadline passed while the provider answered:
    a token spent for nothing sent. Now the key comes first, and the token only with a
    connection in hand."""
    server = await serve(keys_service(lambda key: False))
    never = asyncio.Event()

    async def stuck() -> str:
        await never.wait()
        return API_KEY

    limit = RateLimit(per_second=0.01)  # a token spent would not come back within the test
    options: dict[str, Any] = {"rate_limit": limit, "deadline": 0.2}
    async with AsyncSearchClient(stuck, base_url=server.base_url, **options) as client:
        with pytest.raises(APITimeoutError) as caught:
            async with asyncio.timeout(BOUND):
                await client.get_extraction(JOB_ID)
    error = caught.value
    assert "api_key provider" in str(error)
    assert "it was not sent" in str(error)
    assert (error.request_sent, error.attempts) == (False, 0)
    assert limit.tokens == 1
    assert server.seen == []


class HeldProvider:
    """An async provider whose questions wait for ``gate``: ``asked[n]`` is set as question
    ``n + 1`` begins. It answers ``<API_KEY>-<asks>``, or raises ``error``."""

    def __init__(self, error: Exception | None = None) -> None:
        self.asks = 0
        self.asked = [asyncio.Event(), asyncio.Event()]
        self.gate = asyncio.Event()
        self.error = error

    async def __call__(self) -> str:
        self.asks += 1
        self.asked[self.asks - 1].set()
        await self.gate.wait()
        if self.error is not None:
            raise self.error
        return f"{API_KEY}-{self.asks}"


async def ask_and_join(
    client: AsyncSearchClient, provider: HeldProvider, joining: int
) -> tuple[asyncio.Task[Any], list[asyncio.Task[Any]]]:
    """A call that asks ``provider`` (held), then ``joining`` calls that join its question."""
    asker = asyncio.create_task(client.get_extraction(JOB_ID))
    await provider.asked[0].wait()
    joined = [asyncio.create_task(client.get_extraction(job)) for job in IDS[:joining]]
    await turns()  # each runs to its ask, which joins the question in flight
    return asker, joined


async def test_calls_asking_while_a_question_is_in_flight_take_its_answer(serve: Serve) -> None:
    """Before: one lock held across the provider's await, and each call's first ask a new
    question: N calls asked N times, one after another (640 ids at 20 ms a question: 15 s).
    Now a call that asks while a question is in flight takes its answer."""
    server = await serve(keys_service(lambda key: False))
    provider = HeldProvider()
    async with AsyncSearchClient(provider, base_url=server.base_url) as client:
        async with asyncio.timeout(BOUND):
            asker, joined = await ask_and_join(client, provider, 9)
            provider.gate.set()
            await asyncio.gather(asker, *joined)
    assert provider.asks == 1
    assert sent_keys(server) == [f"{API_KEY}-1"] * 10


async def test_a_call_cancelled_as_it_asks_leaves_the_question_to_the_calls_that_joined(
    serve: Serve,
) -> None:
    """The call whose task asks the provider is cancelled while the question is in flight: the
    calls that joined it are not left waiting for an answer that never comes (a hang); one of
    them asks again, and they all take that answer."""
    server = await serve(keys_service(lambda key: False))
    provider = HeldProvider()
    async with AsyncSearchClient(provider, base_url=server.base_url) as client:
        async with asyncio.timeout(BOUND):
            asker, joined = await ask_and_join(client, provider, 3)
            asker.cancel()
            await provider.asked[1].wait()  # one of them asked again, the others joined it
            provider.gate.set()
            await asyncio.gather(*joined)
        with pytest.raises(asyncio.CancelledError):
            await asker
    assert provider.asks == 2
    assert sent_keys(server) == [f"{API_KEY}-2"] * 3


async def test_calls_that_joined_a_failing_question_get_its_error(serve: Serve) -> None:
    """The provider fails while other calls wait for its answer: each of them raises that error
    (a direct call raises the provider's own error), and the provider is asked once."""
    server = await serve(keys_service(lambda key: False))
    provider = HeldProvider(LookupError("the vault is sealed"))
    async with AsyncSearchClient(provider, base_url=server.base_url) as client:
        async with asyncio.timeout(BOUND):
            asker, joined = await ask_and_join(client, provider, 3)
            provider.gate.set()
            outcomes = await asyncio.gather(asker, *joined, return_exceptions=True)
    assert all(outcome is provider.error for outcome in outcomes)
    assert provider.asks == 1
    assert server.seen == []


async def test_a_bulk_call_asks_once_and_a_rotated_key_comes_after_a_401(serve: Serve) -> None:
    """Issue 45's time: a question of 20 ms asked by every id of a bulk call made each wave of
    calls wait for one (640 ids at 64 in flight: 10 questions, 0.3 s against 0.1 s with a
    string key). The ids take the answer given since the call began; the provider's next key
    comes after a 401 (a rotation mid-call), one question for every id in flight."""
    provider = Provider(is_async=True)
    served = 0
    answer = keys_service(lambda key: served > 50 and key.endswith("-1"))

    async def handler(request: web.Request) -> web.StreamResponse:
        nonlocal served
        served += 1
        return await answer(request)

    server = await serve(handler)
    async with AsyncSearchClient(provider, base_url=server.base_url) as client:
        async with asyncio.timeout(BOUND):
            results = await client.gather_extractions(IDS, concurrency=16)
    assert all(result.ok for result in results)
    assert provider.asks == 2  # once before the first id; once after the first 401
    keys = sent_keys(server)
    assert keys[:50] == [f"{API_KEY}-1"] * 50
    assert set(keys) == {f"{API_KEY}-1", f"{API_KEY}-2"}
    refused = keys.count(f"{API_KEY}-1") - 50
    assert 1 <= refused <= 16  # the ids in flight at the rotation, each refused once
    assert keys.count(f"{API_KEY}-2") == len(IDS) - 50
