"""Security promises over real loopback sockets: the key stays secret, TLS is verified, ids cannot
change a path, plain http is refused off loopback, and a silent server never hangs a caller."""

from __future__ import annotations

import asyncio
import logging
import ssl
import traceback
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import trustme

from asyncsearch import (
    APIConnectionError,
    APIStatusError,
    APITimeoutError,
    AsyncSearchClient,
    AsyncSearchError,
    ConfigurationError,
    ExtractionJob,
    InvalidRequestError,
    Timeout,
    _call,
)

from .conftest import API_KEY, JOB_ID, LOG_ID
from .faults_helpers import (
    Conn,
    RawRequest,
    RawServer,
    Respond,
    full_backlog,
    http_response,
    raw_server,
    stall,
)
from .helpers import TIME_SCALE, held_connections

pytestmark = pytest.mark.timeout(30)

JOB = (Path(__file__).parent / "samples" / "extraction_job.json").read_bytes()
BOUND = 10.0 * TIME_SCALE


@pytest.fixture(autouse=True)
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    delays: list[float] = []

    async def record(delay: float) -> None:
        delays.append(delay)
        await asyncio.sleep(0)

    monkeypatch.setattr(_call, "_sleep", record)
    return delays


def make_client(server: RawServer | str, key: Any = API_KEY, **options: Any) -> AsyncSearchClient:
    base_url = server if isinstance(server, str) else server.base_url
    return AsyncSearchClient(key, base_url=base_url, **options)


async def _async_key() -> str:
    return API_KEY


#: The key as a string, and as a sync and an async provider (api_key=): the same promises.
KEYS = pytest.mark.parametrize(
    "key", [API_KEY, lambda: API_KEY, _async_key], ids=["string", "sync_provider", "async_provider"]
)


def answer(raw: bytes | Callable[[RawRequest], bytes], *, keep_alive: bool = True) -> Respond:
    async def respond(request: RawRequest, conn: Conn) -> bool:
        conn.writer.write(raw(request) if callable(raw) else raw)
        await conn.writer.drain()
        return keep_alive

    return respond


def job_answer() -> Respond:
    return answer(http_response(200, JOB))


# -- TLS -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


def server_tls(ca: trustme.CA, *names: str) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert(*names).configure_cert(context)
    return context


def trusting(ca: trustme.CA) -> ssl.SSLContext:
    context = ssl.create_default_context()
    ca.configure_trust(context)
    return context


@pytest_asyncio.fixture
async def tls_server(ca: trustme.CA) -> AsyncIterator[RawServer]:
    async with raw_server(job_answer(), tls=server_tls(ca, "127.0.0.1")) as server:
        yield server


async def test_tls_is_verified_by_default_and_a_bad_certificate_is_not_retried(
    tls_server: RawServer, sleeps: list[float]
) -> None:
    client = make_client(tls_server, max_retries=3)
    async with asyncio.timeout(BOUND):
        with pytest.raises(APIConnectionError, match="certificate verification failed") as info:
            await client.get_extraction(JOB_ID)
    assert held_connections(client) == 0
    await client.aclose()
    await tls_server.wait_all_closed()
    assert not info.value.retryable
    assert info.value.attempts == 1
    assert sleeps == []
    # Exactly one TCP connection and one handshake attempt; no request ever got through.
    assert tls_server.connections == 1
    assert tls_server.established == 0
    assert tls_server.requests == 0


async def test_no_path_of_a_default_client_skips_certificate_verification(
    ca: trustme.CA, sleeps: list[float]
) -> None:
    # An independent guard of the default: a search (POST), a derived client and a bulk fetch,
    # to a server whose certificate is valid for its name but signed by a CA nobody trusts.
    async with raw_server(job_answer(), tls=server_tls(ca, "127.0.0.1", "localhost")) as server:
        async with AsyncSearchClient(API_KEY, base_url=server.base_url) as client:
            derived = client.with_options(max_retries=2, timeout=5)
            async with asyncio.timeout(BOUND):
                with pytest.raises(APIConnectionError, match="certificate"):
                    await client.search("invoice")
                with pytest.raises(APIConnectionError, match="certificate"):
                    await derived.get_extraction(JOB_ID)
                [result] = await client.gather_extractions([JOB_ID])
        assert isinstance(result.error, APIConnectionError)
        assert "certificate" in str(result.error)
        await server.wait_all_closed()
    assert server.established == 0
    assert server.requests == 0


async def test_a_certificate_for_another_name_is_refused(ca: trustme.CA) -> None:
    async with raw_server(job_answer(), tls=server_tls(ca, "api.example.test")) as server:
        client = make_client(server, ssl=trusting(ca), max_retries=3)
        with pytest.raises(APIConnectionError, match="certificate") as info:
            await client.get_extraction(JOB_ID)
        await client.aclose()
        await server.wait_all_closed()
    assert info.value.attempts == 1
    assert server.connections == 1
    assert server.established == 0


async def test_a_custom_ssl_context_trusts_a_private_ca(
    tls_server: RawServer, ca: trustme.CA
) -> None:
    async with make_client(tls_server, ssl=trusting(ca)) as client:
        job = await client.get_extraction(JOB_ID)
    assert isinstance(job, ExtractionJob)
    assert tls_server.requests == 1
    assert tls_server.seen[0].headers["x-api-key"] == API_KEY


async def test_https_to_http_redirect_is_not_followed(ca: trustme.CA) -> None:
    async with raw_server(job_answer()) as plain:
        downgrade = f"http://127.0.0.1:{plain.port}/v2/extract/{JOB_ID}"
        redirect = answer(http_response(302, b"", headers={"Location": downgrade}))
        async with (
            raw_server(redirect, tls=server_tls(ca, "127.0.0.1")) as secure,
            make_client(secure, ssl=trusting(ca)) as client,
        ):
            with pytest.raises(APIStatusError, match="not followed") as info:
                await client.get_extraction(JOB_ID)
    assert info.value.status_code == 302
    assert secure.requests == 1
    assert plain.connections == 0


# -- plain http only to loopback -----------------------------------------------------------------


@pytest.mark.parametrize(
    "base_url",
    [
        "http://api.example.com",
        "http://10.0.0.1",
        "http://192.168.1.10:8080/api",
        "http://localhost.example.com",
        "http://127.0.0.1.nip.io",
        "HTTP://API.EXAMPLE.COM",
    ],
)
def test_plain_http_off_loopback_needs_allow_http(base_url: str) -> None:
    with pytest.raises(ConfigurationError, match="allow_http=True"):
        make_client(base_url)
    client = make_client(base_url, allow_http=True)
    assert client._options.base_url.lower().startswith("http://")
    with pytest.raises(ConfigurationError, match="allow_http=True"):
        make_client("https://api.example.com").with_options(base_url=base_url)


@pytest.mark.parametrize(
    "base_url",
    [
        "http://127.0.0.1:8080",
        "http://127.0.0.2",
        "http://localhost:1",
        "http://[::1]:8080",
        "http://emulator.localhost",
        "https://api.example.com",
    ],
)
def test_loopback_and_https_need_no_flag(base_url: str) -> None:
    client = make_client(base_url)
    assert client._options.allow_http is False


def test_a_key_in_the_base_url_is_refused_without_echoing_it() -> None:
    for base_url in (
        f"https://user:{API_KEY}@api.example.com",
        f"https://api.example.com/?k={API_KEY}",
    ):
        with pytest.raises(ConfigurationError) as info:
            make_client(base_url)
        assert API_KEY not in str(info.value)


async def test_extra_headers_cannot_replace_the_key_or_the_base() -> None:
    async with raw_server(job_answer()) as server:
        # The client's own headers: refused when the client is made, the value never echoed.
        for name in ("x-api-key", "X-SERVICE-BASE-ID"):
            with pytest.raises(ConfigurationError, match=f"cannot set {name}") as caught:
                make_client(server, headers={name: "someone-else"})
            assert "someone-else" not in str(caught.value)
        headers = {"X-Trace": "1", "user-agent": "mine/1"}
        async with make_client(server, headers=headers, base_id="mine") as client:
            # A call's extra headers: refused before anything is sent.
            for name in ("X-Api-Key", "x-service-base-id"):
                with pytest.raises(InvalidRequestError, match=f"cannot set {name}"):
                    await client.get_extraction(JOB_ID, extra_headers={name: "someone-else"})
                with pytest.raises(InvalidRequestError, match=f"cannot set {name}"):
                    await client.gather_extractions([JOB_ID], extra_headers={name: "x"})
            assert server.seen == []
            await client.get_extraction(JOB_ID, extra_headers={"x-trace": "2", "X-Call": "c"})
            await client.get_extraction(JOB_ID)
    first, second = server.seen
    for seen in (first, second):
        assert seen.headers["x-api-key"] == API_KEY
        assert seen.headers["x-service-base-id"] == "mine"
        # One header of a name, whatever the case it was given in.
        assert seen.headers["user-agent"] == "mine/1"
    assert first.headers["x-trace"] == "2"
    assert first.headers["x-call"] == "c"
    assert second.headers["x-trace"] == "1"
    assert "x-call" not in second.headers


FRAMING_HEADERS = [
    "Content-Length",
    "transfer-encoding",
    "Host",
    "Connection",
    "Keep-Alive",
    "TE",
    "Trailer",
    "Upgrade",
    "Expect",
    "Proxy-Connection",
    "Content-Type",
    "Content-Encoding",
]
NOT_HEADER_NAMES = ["X-Api-Key ", " X-Trace", "X Trace", "", "X-A:b", "X-\u00fc", "X-A\r\nX-B"]


@pytest.mark.parametrize("name", FRAMING_HEADERS)
async def test_headers_that_frame_or_route_the_message_are_refused(name: str) -> None:
    # Issue 27: {"Transfer-Encoding": "chunked"} went out beside Content-Length over an unchunked
    # body (the request-smuggling shape), {"Content-Length": "2"} cut the body to two bytes.
    value = {"content-length": "2", "transfer-encoding": "chunked"}.get(name.lower(), "x")
    async with raw_server(job_answer()) as server:
        with pytest.raises(ConfigurationError, match=f"cannot set {name}: it frames or routes"):
            make_client(server, headers={name: value})
        async with make_client(server) as client:
            with pytest.raises(InvalidRequestError, match=f"cannot set {name}"):
                await client.get_extraction(JOB_ID, extra_headers={name: value})
            with pytest.raises(InvalidRequestError, match=f"cannot set {name}"):
                await client.search("invoice", extra_headers={name: value})
            with pytest.raises(ConfigurationError, match=f"cannot set {name}"):
                client.with_options(headers={name: value})
        assert server.seen == []


@pytest.mark.parametrize("name", NOT_HEADER_NAMES)
async def test_header_names_must_be_tokens(name: str) -> None:
    # "X-Api-Key " (a trailing space) went out next to the real key.
    async with raw_server(job_answer()) as server:
        with pytest.raises(ConfigurationError, match="is not a header name"):
            make_client(server, headers={name: "x"})
        async with make_client(server) as client:
            with pytest.raises(InvalidRequestError, match="is not a header name"):
                await client.get_extraction(JOB_ID, extra_headers={name: "x"})
        assert server.seen == []


async def test_header_values_and_names_given_twice_are_refused() -> None:
    async with raw_server(job_answer()) as server:
        async with make_client(server) as client:
            # A lone CR too: it passed the check, then failed at send time as a connection error.
            for value in ("a\r\nX-Injected: 1", "a\nb", "a\x00b", "a\rb", "a\r"):
                with pytest.raises(InvalidRequestError, match="line breaks"):
                    await client.get_extraction(JOB_ID, extra_headers={"X-Trace": value})
                with pytest.raises(ConfigurationError, match="line breaks"):
                    client.with_options(headers={"X-Trace": value})
            # In either order: one name given twice is refused, never merged.
            for twice in ({"X-Trace": "1", "x-trace": "2"}, {"x-trace": "1", "X-Trace": "2"}):
                with pytest.raises(InvalidRequestError, match="names one header twice"):
                    await client.get_extraction(JOB_ID, extra_headers=twice)
                with pytest.raises(ConfigurationError, match="names one header twice"):
                    client.with_options(headers=twice)
                with pytest.raises(ConfigurationError, match="names one header twice"):
                    make_client(server, headers=twice)
        assert server.seen == []


async def test_with_options_merges_headers_into_the_clients() -> None:
    # Issue 27: with_options(headers=...) dropped the client's other headers.
    async with raw_server(job_answer()) as server:
        headers = {"X-Team": "search", "X-Trace": "1", "X-Gone": "soon"}
        async with make_client(server, headers=headers) as client:
            child = client.with_options(headers={"x-trace": "2", "X-New": "n", "X-Gone": None})
            await child.get_extraction(JOB_ID)
            await client.get_extraction(JOB_ID)
            cleared = client.with_options(headers=None)
            await cleared.get_extraction(JOB_ID)
    merged, parent, none = (seen.headers for seen in server.seen)
    assert merged["x-team"] == "search"  # kept
    assert merged["x-trace"] == "2"  # replaced, whatever the case, sent once
    assert merged["x-new"] == "n"
    assert "x-gone" not in merged  # None removes it
    assert (parent["x-trace"], parent["x-gone"]) == ("1", "soon")  # the parent is unchanged
    assert not {"x-team", "x-trace", "x-gone"} & set(none)
    assert none["x-api-key"] == API_KEY


# -- ids cannot change the path ------------------------------------------------------------------

BAD_IDS: list[object] = [
    "..",
    "%2e%2e",
    "a/b",
    "a?b",
    "a#b",
    "",
    "é",
    f"../{JOB_ID}",
    f"{JOB_ID}/..",
    f"{JOB_ID}/webhook-logs",
    f"{JOB_ID}?format=json",
    f"{JOB_ID}#x",
    f"{JOB_ID}\n",
    f" {JOB_ID}",
    f"{JOB_ID}%00",
    JOB_ID.upper(),
    JOB_ID.replace("9", "\uff19"),  # a full-width digit
    JOB_ID.replace("-", "\u2010"),  # a Unicode hyphen
    "%2F".join(JOB_ID.split("-")),
    123,
    JOB_ID.encode(),
]

IdCall = Callable[[AsyncSearchClient, Any], Awaitable[object]]


async def first_result_error(client: AsyncSearchClient, bad: Any) -> object:
    (result,) = await client.gather_extractions([bad])
    assert result.error is not None
    raise result.error


async def first_iterated_error(client: AsyncSearchClient, bad: Any) -> object:
    async with client.iter_extractions([bad]) as results:
        async for result in results:
            assert result.error is not None
            raise result.error
    return None


ID_CALLS: dict[str, IdCall] = {
    "get_extraction": lambda c, bad: c.get_extraction(bad),
    "get_extraction markdown": lambda c, bad: c.get_extraction(bad, format="markdown"),
    "list_webhook_logs": lambda c, bad: c.list_webhook_logs(bad),
    "get_webhook_log job": lambda c, bad: c.get_webhook_log(bad, LOG_ID),
    "get_webhook_log log": lambda c, bad: c.get_webhook_log(JOB_ID, bad),
    "raw get_webhook_log": lambda c, bad: c.with_raw_response.get_webhook_log(JOB_ID, bad),
    "search resource_id": lambda c, bad: c.search(resource_id=bad),
    "search queries": lambda c, bad: c.search(queries=[{"resourceId": bad}]),
    "wait_for_extraction": lambda c, bad: c.wait_for_extraction(bad, max_wait=1),
    "gather_extractions": first_result_error,
    "iter_extractions": first_iterated_error,
}


async def test_no_bad_id_reaches_the_server_on_any_endpoint() -> None:
    async with raw_server(job_answer()) as server, make_client(server) as client:
        for name, call in ID_CALLS.items():
            for bad in BAD_IDS:
                with pytest.raises(InvalidRequestError):
                    await call(client, bad)
                assert server.connections == 0, (name, bad)
        with pytest.raises(InvalidRequestError):
            client.search_pages(resource_id="a/b")
        # The same client, with a good id, does reach it.
        await client.get_webhook_log(uuid.UUID(JOB_ID), LOG_ID)
    assert [seen.target for seen in server.seen] == [f"/v2/extract/{JOB_ID}/webhook-logs/{LOG_ID}"]


# -- default timeouts: every limit alone stops a silent server -----------------------------------


@pytest.mark.parametrize(
    ("timeout", "words"),
    [
        (Timeout(connect=None, read=0.2, total=None), "waiting for data"),
        (Timeout(connect=None, read=None, total=0.3), "total timeout"),
        (0.3, "total timeout"),
    ],
)
async def test_each_limit_alone_ends_a_silent_server(timeout: Timeout | float, words: str) -> None:
    async with raw_server(stall) as server:
        async with make_client(server, timeout=timeout, max_retries=0) as client:
            async with asyncio.timeout(BOUND):
                with pytest.raises(APITimeoutError, match=words):
                    await client.search("silence")
        await server.wait_all_closed()
    assert server.requests == 1


async def test_the_connect_limit_alone_ends_a_connect_that_hangs() -> None:
    with full_backlog() as port:
        timeout = Timeout(connect=0.3, read=None, total=None)
        async with make_client(f"http://127.0.0.1:{port}", timeout=timeout, max_retries=0) as c:
            async with asyncio.timeout(BOUND):
                with pytest.raises(APIConnectionError) as info:
                    await c.search("silence")
    if not isinstance(info.value, APITimeoutError):
        pytest.skip("this kernel refuses connections past the backlog")
    assert "connecting" in str(info.value)


def test_the_default_timeout_is_finite_on_every_client() -> None:
    client = make_client("https://api.example.com")
    for derived in (client, client.with_options(max_retries=0), client.with_options(base_id="b")):
        timeout = derived._options.timeout
        assert timeout.connect is not None
        assert timeout.read is not None
        assert timeout.total is not None
        assert timeout.pool is not None
        assert max(timeout.connect, timeout.read, timeout.total, timeout.pool) <= 180
    # Only an explicit timeout=None turns the limits off (as in httpx and openai-python).
    off = client.with_options(timeout=None)._options.timeout
    assert off == Timeout(connect=None, read=None, total=None, pool=None)


# -- the key never leaks -------------------------------------------------------------------------


def chain(error: BaseException) -> list[BaseException]:
    """The error and everything reachable through __cause__ and __context__."""
    found: list[BaseException] = []
    todo = [error]
    while todo:
        item = todo.pop()
        if any(item is seen for seen in found):
            continue
        found.append(item)
        for linked in (item.__cause__, item.__context__):
            if linked is not None:
                todo.append(linked)
        if isinstance(item, BaseExceptionGroup):
            todo.extend(item.exceptions)
    return found


def everything_about(error: BaseException) -> str:
    """Every text a logger, a crash reporter or a curious developer gets from an error."""
    parts = ["".join(traceback.format_exception(error))]
    for item in chain(error):
        parts.extend((str(item), repr(item), repr(item.args)))
        for name, value in vars(item).items():
            parts.append(f"{name}={value!r}")
            if hasattr(value, "__dict__") or hasattr(value, "__slots__"):
                parts.append(repr(getattr(value, "__dict__", "")))
    return "\n".join(parts)


def echo_key(request: RawRequest) -> str:
    return request.headers.get("x-api-key", "")


@KEYS
async def test_the_key_is_in_no_log_no_repr_and_no_error(
    caplog: pytest.LogCaptureFixture, ca: trustme.CA, key: Any
) -> None:
    """Many failure kinds, the server echoing the key wherever it can; nothing shows it."""
    caplog.set_level(logging.DEBUG)  # the root logger: asyncsearch, aiohttp and asyncio

    async def respond(request: RawRequest, conn: Conn) -> bool:
        key = echo_key(request)
        target = request.target
        if "/webhook-logs/" in target:
            await stall(request, conn)
            return False
        echoing = {"X-Echo": key, "Set-Cookie": f"k={key}"}
        if target.startswith("/401"):
            raw = http_response(401, f'{{"message": "bad key {key}"}}'.encode(), headers=echoing)
        elif target.startswith("/429"):
            raw = http_response(429, b"{}", headers={**echoing, "Retry-After": "3600"})
        elif target.startswith("/500"):
            raw = http_response(500, f"<html>{key}</html>".encode() * 200, headers=echoing)
        elif target.startswith("/html"):
            raw = http_response(200, f"<html>{key}</html>".encode(), headers=echoing)
        elif target.startswith("/schema"):
            raw = http_response(200, f'{{"id": 7, "name": "{key}"}}'.encode(), headers=echoing)
        elif target.startswith("/utf8"):
            raw = http_response(200, f'{{"id": "{key}\xff"}}'.encode("latin-1"))
        elif target.startswith("/big"):
            raw = http_response(200, key.encode() * 1000, headers=echoing)
        elif target.startswith("/away"):
            raw = http_response(302, b"", headers={"Location": f"http://127.0.0.2/?k={key}"})
        elif target.startswith("/loop"):
            raw = http_response(302, b"", headers={"Location": target, "X-Echo": key})
        elif target.startswith("/chunk"):
            raw = http_response(200, b"", headers={"Transfer-Encoding": "chunked"}) + b"zz\r\n"
        elif target.startswith("/cut"):
            raw = http_response(200, JOB, headers={"Content-Length": "99999"})
        elif target.startswith("/drop"):
            return False
        elif target.startswith("/pending"):
            raw = http_response(200, JOB)
        else:
            raw = http_response(200, JOB, headers=echoing)
        conn.writer.write(raw)
        await conn.writer.drain()
        return True

    errors: list[BaseException] = []
    texts: list[str] = []

    async def expect_error(call: Awaitable[object]) -> None:
        try:
            async with asyncio.timeout(BOUND):
                await call
        except (AsyncSearchError, TimeoutError) as exc:
            errors.append(exc)
        else:
            pytest.fail("no error")

    async with raw_server(respond) as server:
        base = server.base_url
        options: dict[str, Any] = {"max_retries": 1, "timeout": Timeout(read=0.3)}
        statuses_and_bodies = ["401", "429", "500", "html", "schema", "utf8", "big", "away", "loop"]
        clients = {
            name: make_client(base + f"/{name}", key, **options, max_response_bytes=20_000)
            for name in [*statuses_and_bodies, "chunk", "cut", "drop", "ok", "pending"]
        }
        for name in statuses_and_bodies:
            await expect_error(clients[name].get_extraction(JOB_ID))
        for name in ("chunk", "cut", "drop"):
            await expect_error(clients[name].search("x"))
        await expect_error(clients["ok"].get_webhook_log(JOB_ID, LOG_ID))  # read timeout
        await expect_error(clients["ok"].get_extraction("not an id"))
        await expect_error(
            clients["pending"].wait_for_extraction(
                JOB_ID, until=lambda job: False, interval=0.01, max_wait=0.2
            )
        )
        raw = await clients["ok"].with_raw_response.get_extraction(JOB_ID)
        texts += [repr(raw), repr(raw.headers), repr(raw.parse())]
        results = await clients["500"].gather_extractions([JOB_ID, "bad"], concurrency=2)
        texts += [repr(results)]
        errors += [r.error for r in results if r.error is not None]
        in_flight = asyncio.create_task(clients["ok"].get_webhook_log(JOB_ID, LOG_ID))
        await asyncio.sleep(0.05)
        await clients["ok"].aclose()
        await expect_error(in_flight)
        for client in clients.values():
            texts += [repr(client), str(client), repr(vars(client))]
            await client.aclose()

    # Failures that need no scripted server: refused, TLS, a connect that never completes.
    async with (
        raw_server(job_answer(), tls=server_tls(ca, "127.0.0.1")) as secure,
        make_client(secure, key) as client,
    ):
        await expect_error(client.search("x"))
    async with make_client("http://127.0.0.1:9", key, max_retries=0) as client:
        await expect_error(client.search("x"))
    with full_backlog() as port:
        options = {"timeout": Timeout(connect=0.2), "max_retries": 0}
        async with make_client(f"http://127.0.0.1:{port}", key, **options) as client:
            await expect_error(client.search("x"))

    kinds = {type(error).__name__ for error in errors}
    assert kinds >= {
        "AuthenticationError",
        "RateLimitError",
        "InternalServerError",
        "ResponseValidationError",
        "ResponseTooLargeError",
        "APIStatusError",
        "APIConnectionError",
        "APITimeoutError",
        "InvalidRequestError",
        "WaitTimeoutError",
        "ClientClosedError",
    }, kinds
    assert len(errors) >= 15
    labelled = [(f"client or response {i}", text) for i, text in enumerate(texts)]
    labelled += [(repr(error)[:80], everything_about(error)) for error in errors]
    labelled.append(("the log", caplog.text))
    for record in caplog.records:
        text = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            text += "".join(traceback.format_exception(record.exc_info[1]))
        labelled.append((f"log record {record.name}", text))
    leaks = [label for label, text in labelled if API_KEY in text]
    assert leaks == [], "\n".join(leaks)
