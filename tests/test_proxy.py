"""``proxy=`` and ``proxy_auth=``: a service whose name does not resolve, reached through a real
forward proxy on loopback (absolute-URI requests forwarded, ``CONNECT`` tunnelled)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import urllib.parse
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
import trustme
import yarl
from aiohttp import web

from asyncsearch import (
    APIConnectionError,
    AsyncSearchClient,
    ConfigurationError,
    ExtractionJob,
    ProxyError,
    RetryBudget,
    _call,
)

from .conftest import API_KEY, JOB_ID, Handler, Server
from .helpers import TIME_SCALE
from .test_call_options import ANSWERS
from .test_security import everything_about, server_tls, trusting

Serve = Callable[[Handler], Awaitable[Server]]

pytestmark = pytest.mark.timeout(30)

BOUND = 10.0 * TIME_SCALE
#: A name that never resolves (RFC 6761): only the proxy knows where it is.
SERVICE = "search.invalid"
PASSWORD = "proxy-password-DO-NOT-LOG"


def basic(login: str, password: str) -> str:
    """The ``Proxy-Authorization`` value of Basic credentials (RFC 7617)."""
    return "Basic " + base64.b64encode(f"{login}:{password}".encode()).decode()


def basic_auth(login: str, password: str) -> aiohttp.BasicAuth:
    """An ``aiohttp.BasicAuth``, which aiohttp 3.14 deprecates as it is made (a warning, so an
    error in this suite): what a user passing ``proxy_auth=`` makes, whatever its aiohttp."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return aiohttp.BasicAuth(login, password)


class ForwardProxy:
    """An HTTP forward proxy on 127.0.0.1 that knows one name, ``SERVICE``, at ``port``.

    It forwards an absolute-URI request (``GET http://search.invalid/...``) to the service and
    tunnels a ``CONNECT search.invalid:443``; with ``password`` it answers 407 to a request
    without ``Proxy-Authorization`` for it. ``seen`` holds each request's line and headers.
    """

    def __init__(
        self,
        port: int,
        password: str | None = None,
        *,
        garbage: bool = False,
        refuse: int | None = None,
    ) -> None:
        self.port = port
        self.password = password
        self.garbage = garbage  # answer a malformed head instead of forwarding
        self.refuse = refuse  # answer this status to every request, a CONNECT too
        self.seen: list[tuple[str, dict[str, str]]] = []
        self.url = ""
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> ForwardProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                line, *fields = head.decode("latin-1").split("\r\n")[:-2]
                headers = dict(field.split(": ", 1) for field in fields)
                self.seen.append((line, headers))
                method, target, _ = line.split(" ")
                if self.password is not None and headers.get("Proxy-Authorization") != (
                    basic("user", self.password)
                ):
                    writer.write(b"HTTP/1.1 407 Proxy Authentication Required\r\n")
                    writer.write(b"Content-Length: 0\r\n\r\n")
                    await writer.drain()
                    continue
                if self.refuse is not None:
                    writer.write(f"HTTP/1.1 {self.refuse} Refused\r\n".encode())
                    writer.write(b"Content-Length: 0\r\n\r\n")
                    await writer.drain()
                    continue
                if self.garbage:
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: many\r\n\r\n")
                    await writer.drain()
                    return
                if method == "CONNECT":
                    assert target == f"{SERVICE}:443"
                    await self._tunnel(reader, writer)
                    return
                await self._forward(reader, writer, method, yarl.URL(target), headers)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass  # the client went away, or the proxy is closing
        finally:
            writer.close()
            self._tasks.discard(task)

    async def _forward(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        method: str,
        target: yarl.URL,
        headers: dict[str, str],
    ) -> None:
        assert target.host == SERVICE  # an absolute URI: the proxy is asked for another host
        body = await reader.readexactly(int(headers.get("Content-Length", "0")))
        hop = {"proxy-authorization", "proxy-connection", "connection", "host"}
        sent = {k: v for k, v in headers.items() if k.lower() not in hop}
        url = target.with_scheme("http").with_host("127.0.0.1").with_port(self.port)
        async with (
            aiohttp.ClientSession(auto_decompress=False) as session,
            session.request(method, url, headers=sent, data=body or None) as answer,
        ):
            content = await answer.read()
            writer.write(f"HTTP/1.1 {answer.status} {answer.reason}\r\n".encode())
            for name, value in answer.headers.items():
                if name.lower() not in ("content-length", "transfer-encoding", "connection"):
                    writer.write(f"{name}: {value}\r\n".encode())
            writer.write(f"Content-Length: {len(content)}\r\n\r\n".encode() + content)
            await writer.drain()

    async def _tunnel(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", self.port)
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await writer.drain()

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError):
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            sink.close()

        await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer))


async def job(request: web.Request) -> web.StreamResponse:
    return web.Response(body=ANSWERS["extract"], content_type="application/json")


@contextlib.asynccontextmanager
async def tls_service(ca: trustme.CA) -> AsyncIterator[int]:
    """The service over TLS on loopback, with a certificate for ``SERVICE``; yields its port."""
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", job)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_tls(ca, SERVICE))
    await site.start()
    try:
        yield runner.addresses[0][1]
    finally:
        await runner.cleanup()


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


def port_of(server: Server) -> int:
    port = yarl.URL(server.base_url).port
    assert port is not None
    return port


async def test_a_service_whose_name_does_not_resolve_is_reached_through_the_proxy(
    serve: Serve,
) -> None:
    server = await serve(job)
    async with ForwardProxy(port_of(server)) as proxy:
        base = f"http://{SERVICE}"
        options: dict[str, Any] = {"allow_http": True, "max_retries": 0}
        async with AsyncSearchClient(API_KEY, base_url=base, **options) as direct:
            # No proxy: the name does not resolve (or, without a resolver, the lookup hangs).
            with pytest.raises((APIConnectionError, TimeoutError)):
                async with asyncio.timeout(BOUND):
                    await direct.get_extraction(JOB_ID)
        options = {"allow_http": True, "proxy": proxy.url}
        async with AsyncSearchClient(API_KEY, base_url=base, **options) as client:
            async with asyncio.timeout(BOUND):
                found = await client.get_extraction(JOB_ID)
                results = await client.gather_extractions([JOB_ID] * 3, concurrency=3)
    assert isinstance(found, ExtractionJob)
    assert all(result.ok for result in results)
    assert proxy.seen[0][0] == f"GET http://{SERVICE}/v2/extract/{JOB_ID} HTTP/1.1"
    assert len(proxy.seen) == 4
    assert [seen.headers["X-Api-Key"] for seen in server.seen] == [API_KEY] * 4


@pytest.mark.parametrize("way", ["proxy_auth", "in_the_url"])
async def test_proxy_auth_reaches_the_proxy_as_proxy_authorization(serve: Serve, way: str) -> None:
    server = await serve(job)
    auth = basic_auth("user", PASSWORD)
    async with ForwardProxy(port_of(server), password=PASSWORD) as proxy:
        options: dict[str, Any] = {"allow_http": True, "proxy": proxy.url, "proxy_auth": auth}
        if way == "in_the_url":
            options["proxy"] = proxy.url.replace("http://", f"http://user:{PASSWORD}@")
            del options["proxy_auth"]
        async with AsyncSearchClient(API_KEY, base_url=f"http://{SERVICE}", **options) as client:
            async with asyncio.timeout(BOUND):
                await client.get_extraction(JOB_ID)
            texts = [repr(client), repr(vars(client))]
    assert proxy.seen[0][1]["Proxy-Authorization"] == auth.encode()
    assert "Proxy-Authorization" not in server.seen[0].headers  # the proxy's, not forwarded
    assert [text for text in texts if PASSWORD in text] == []


async def test_an_http_proxy_tunnels_to_an_https_service(ca: trustme.CA) -> None:
    """No allow_http: the service is https://, only the way to the proxy is plain."""
    auth = basic_auth("user", PASSWORD)
    async with tls_service(ca) as port, ForwardProxy(port, password=PASSWORD) as proxy:
        options: dict[str, Any] = {"proxy": proxy.url, "proxy_auth": auth, "ssl": trusting(ca)}
        async with AsyncSearchClient(API_KEY, base_url=f"https://{SERVICE}", **options) as client:
            async with asyncio.timeout(BOUND):
                found = await client.get_extraction(JOB_ID)
    assert isinstance(found, ExtractionJob)
    assert proxy.seen[0][0] == f"CONNECT {SERVICE}:443 HTTP/1.1"
    assert proxy.seen[0][1]["Proxy-Authorization"] == auth.encode()


@pytest.mark.parametrize("scheme", ["http", "https"])
async def test_a_proxy_refusing_the_credentials_shows_none_of_them(
    serve: Serve, ca: trustme.CA, scheme: str
) -> None:
    """A 407 for a plain request, or for a tunnel, with the password in ``proxy_auth`` and in
    the proxy's URL: no error, traceback or log shows it."""
    server = await serve(job)
    async with tls_service(ca) as port:
        target = port if scheme == "https" else port_of(server)
        async with ForwardProxy(target, password="another-password") as proxy:
            for way in ("auth", "url"):
                options: dict[str, Any] = {"allow_http": True, "max_retries": 0}
                options["ssl"] = trusting(ca)
                if way == "auth":
                    options |= {
                        "proxy": proxy.url,
                        "proxy_auth": basic_auth("user", PASSWORD),
                    }
                else:
                    options["proxy"] = proxy.url.replace("http://", f"http://user:{PASSWORD}@")
                base = f"{scheme}://{SERVICE}"
                async with AsyncSearchClient(API_KEY, base_url=base, **options) as client:
                    with pytest.raises(Exception) as caught:
                        await client.get_extraction(JOB_ID)
                text = everything_about(caught.value)
                assert "407" in text
                assert PASSWORD not in text
                assert basic("user", PASSWORD) not in text


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"proxy": "http://127.0.0.1:3128", "session": "S"}, "proxy cannot be given with session"),
        ({"proxy_auth": basic_auth("u", "p")}, "proxy_auth must be an aiohttp.BasicAuth"),
        ({"proxy": "http://127.0.0.1:1", "proxy_auth": ("u", "p")}, "proxy_auth must be"),
        ({"proxy": f"socks5://user:{PASSWORD}@127.0.0.1:1"}, "proxy must be an http"),
        ({"proxy": f"http://user:{PASSWORD}@[::1"}, "proxy must be an http"),
        ({"proxy": "http://"}, "proxy must be an http"),
        ({"proxy": 3128}, "proxy must be an http"),
    ],
)
async def test_proxy_options_are_checked_without_quoting_them(
    options: dict[str, Any], words: str
) -> None:
    if options.get("session") == "S":
        options["session"] = aiohttp.ClientSession()
    try:
        with pytest.raises(ConfigurationError, match=words) as caught:
            AsyncSearchClient(API_KEY, base_url="https://example.com", **options)
    finally:
        if isinstance(options.get("session"), aiohttp.ClientSession):
            await options["session"].close()
    assert PASSWORD not in str(caught.value)


async def test_a_proxy_url_is_a_str_or_a_yarl_url_and_may_be_https() -> None:
    for proxy in (yarl.URL("http://127.0.0.1:3128"), "https://proxy.example:8443"):
        client = AsyncSearchClient(API_KEY, base_url="https://example.com", proxy=proxy)
        await client.aclose()


async def test_a_malformed_answer_through_the_proxy_shows_no_proxy_authorization(
    serve: Serve,
) -> None:
    """aiohttp's error keeps the request's headers (``request_info``), Proxy-Authorization among
    them: scrubbed like the key."""
    server = await serve(job)
    auth = basic_auth("user", PASSWORD)
    async with ForwardProxy(port_of(server), password=PASSWORD, garbage=True) as proxy:
        options: dict[str, Any] = {"allow_http": True, "proxy": proxy.url, "proxy_auth": auth}
        options["max_retries"] = 0
        async with AsyncSearchClient(API_KEY, base_url=f"http://{SERVICE}", **options) as client:
            with pytest.raises(APIConnectionError, match="malformed") as caught:
                await client.get_extraction(JOB_ID)
    assert proxy.seen[0][1]["Proxy-Authorization"] == auth.encode()
    text = everything_about(caught.value)
    assert "Proxy-Authorization" in text  # the headers are there, the credentials are not
    assert auth.encode() not in text


# -- issue 45: a proxy's refusal is the proxy's, and its credentials are secrets -------------


@pytest.fixture
def no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    async def fake_sleep(delay: float) -> None:
        await asyncio.sleep(0)

    monkeypatch.setattr(_call, "_sleep", fake_sleep)


@pytest.mark.usefixtures("no_backoff")
@pytest.mark.parametrize(("status", "connects"), [(407, 1), (502, 3)])
async def test_a_proxy_refusing_the_tunnel_is_a_proxy_error_nothing_sent(
    ca: trustme.CA, status: int, connects: int
) -> None:
    """Before: "the server sent a malformed response", request_sent=True, 3 CONNECTs for one
    call even for a 407. Now the proxy's refusal, never retried for a 407; a 502 (the proxy
    could not reach the service) is retried as a connection that failed before sending."""
    budget = RetryBudget()
    async with tls_service(ca) as port, ForwardProxy(port, refuse=status) as proxy:
        options: dict[str, Any] = {"proxy": proxy.url, "ssl": trusting(ca), "retry_budget": budget}
        async with AsyncSearchClient(API_KEY, base_url=f"https://{SERVICE}", **options) as client:
            with pytest.raises(ProxyError) as caught:
                async with asyncio.timeout(BOUND):
                    await client.get_extraction(JOB_ID)
    error = caught.value
    assert isinstance(error, APIConnectionError)
    assert (error.status_code, error.request_sent, error.retryable) == (
        status,
        False,
        status != 407,
    )
    assert "proxy refused" in str(error)
    assert error.attempts == connects
    assert [line for line, _ in proxy.seen] == [f"CONNECT {SERVICE}:443 HTTP/1.1"] * connects


async def test_a_proxy_s_407_stops_a_bulk_call_like_a_401(ca: trustme.CA) -> None:
    """Before: 200 ids made 300 CONNECTs with refused credentials and drained the retry budget.
    Now the first 407 stops the call: the ids in flight fail with it, the rest are not sent."""
    budget = RetryBudget()
    async with tls_service(ca) as port, ForwardProxy(port, refuse=407) as proxy:
        options: dict[str, Any] = {"proxy": proxy.url, "ssl": trusting(ca), "retry_budget": budget}
        async with AsyncSearchClient(API_KEY, base_url=f"https://{SERVICE}", **options) as client:
            async with asyncio.timeout(BOUND):
                results = await client.gather_extractions([JOB_ID] * 200, concurrency=16)
    assert len(results) == 200
    assert all(isinstance(r.error, ProxyError) and r.error.status_code == 407 for r in results)
    assert 1 <= len(proxy.seen) <= 16
    assert budget.tokens == budget.capacity  # nothing retried
    assert sum("not sent" in str(r.error) for r in results) >= 200 - 16


async def test_a_plain_http_proxy_s_407_is_a_proxy_error_not_retried(serve: Serve) -> None:
    server = await serve(job)
    async with ForwardProxy(port_of(server), password="another-password") as proxy:
        options: dict[str, Any] = {"allow_http": True, "proxy": proxy.url}
        async with AsyncSearchClient(API_KEY, base_url=f"http://{SERVICE}", **options) as client:
            with pytest.raises(ProxyError) as caught:
                await client.get_extraction(JOB_ID)
    assert (caught.value.status_code, caught.value.request_sent) == (407, False)
    assert len(proxy.seen) == 1
    assert server.seen == []


PROXY_FORMS = {
    "raw": ("team", "s3cretPW"),
    "percent-encoded": ("team", "p@ss:w/rd%"),
}


@pytest.mark.parametrize("form", list(PROXY_FORMS))
async def test_proxy_credentials_are_scrubbed_from_a_middleware_s_error(
    serve: Serve, form: str
) -> None:
    """Before: the key was scrubbed by its value, the proxy's credentials only by header name,
    so ``RuntimeError("boom", dict(request.headers))`` carried ``Proxy-Authorization``. Now every
    form of them is a secret, scrubbed on copies: the caller's dict is not changed."""
    login, password = PROXY_FORMS[form]
    quoted: list[dict[str, str]] = []

    async def quoting(
        request: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType
    ) -> aiohttp.ClientResponse:
        headers = dict(request.headers)
        quoted.append(headers)
        error = RuntimeError("boom", headers, f"{login}:{password}", password.encode())
        error.add_note(f"proxy {login}:{urllib.parse.quote(password, safe='')}")
        raise error

    server = await serve(job)
    async with ForwardProxy(port_of(server)) as proxy:
        url = yarl.URL(proxy.url).with_user(login).with_password(password)
        options: dict[str, Any] = {"allow_http": True, "proxy": str(url)}
        async with AsyncSearchClient(API_KEY, base_url=f"http://{SERVICE}", **options) as client:
            with pytest.raises(RuntimeError) as caught:
                await client.get_extraction(JOB_ID, middlewares=[quoting])
            [result] = await client.gather_extractions([JOB_ID], middlewares=[quoting])
    header = basic(login, password)
    error = caught.value
    for text in (everything_about(error), str(result.error), repr(result.error.__cause__)):
        for secret in (password, header, header.split()[-1], API_KEY):
            assert secret not in text, (secret, text)
    headers = error.args[1]
    assert type(headers) is dict
    assert headers["Proxy-Authorization"] == headers["X-Api-Key"] == "[redacted]"
    assert type(error.args[3]) is bytes
    # The middleware's own dict is as it made it: the error holds a scrubbed copy.
    assert quoted[0]["Proxy-Authorization"] == header
    assert quoted[0]["X-Api-Key"] == API_KEY
