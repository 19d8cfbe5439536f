"""The one place that touches aiohttp: owns the session, sends one attempt, maps every error.

``Transport.send`` runs phases 2 to 6 of an attempt (see ``_call``, whose docstring is the
contract of the whole order): it takes a free connection of the pool (``_concurrency.Slots``, a
first-come-first-served count that knows nothing of aiohttp: a direct call waits at most
``Timeout.pool``, a bulk call without a limit), then, before each request of the attempt (a
same-origin redirect followed is another, never carrying the key anywhere else), lets the call
``admit`` it (its rate-limit token) and sends it; the final answer's body is read under
``max_response_bytes``. What happened is written in the attempt's record (``Attempt``) where it
happens: the SDK's own innermost aiohttp middleware (``Attempt.__call__``) sees each request go out
and its answer's head come back, and refuses a second send. ``classify`` reads that record to tell
an aiohttp error (translated, ``request_sent`` as recorded) from a middleware's own (raised as it
is). Secrets are scrubbed where an error leaves the client, not here.
"""

from __future__ import annotations

# aiohttp runs on asyncio only: its futures are asyncio's. The one timed wait here (the pool's)
# is anyio's, like every deadline, sleep and clock of the core.
import asyncio
import base64
import functools
import sys
import time
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any
from urllib.parse import quote

import aiohttp
import anyio
import yarl
from aiohttp import http_exceptions

from ._checks import running_loop
from ._concurrency import Slots
from ._config import Options
from ._errors import (
    APIConnectionError,
    APITimeoutError,
    AsyncSearchError,
    ClientClosedError,
    ConfigurationError,
    EventLoopMismatchError,
    MiddlewareError,
    PoolTimeoutError,
    ProxyError,
    ResponseTooLargeError,
    ResponseValidationError,
)
from ._protocol import Request, Response, redirect_target, request_id, status_error
from ._version import __version__

USER_AGENT = (
    f"asyncsearch/{__version__} Python/{sys.version_info.major}.{sys.version_info.minor}."
    f"{sys.version_info.micro} aiohttp/{aiohttp.__version__}"
)
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_CHUNK = 64 * 1024
#: How much of an error body is kept: enough for any message, small enough to never matter.
_ERROR_BODY_LIMIT = 64 * 1024
#: The Content-Encodings an inflating aiohttp session decodes itself (aiohttp's own list, matched
#: as it matches it: ASCII, case-insensitive, not stripped). Any other value reaches us as sent.
_SESSION_INFLATES = frozenset({"gzip", "deflate", "br", "zstd"})


#: aiohttp 3.13+ refuses, in a session that inflates, to inflate one chunk past its own limit
#: (an older aiohttp has no such error: the empty tuple matches nothing).
_SessionInflateLimitError: type[Exception] | tuple[()] = getattr(
    http_exceptions, "DecompressSizeError", ()
)
#: A call's timeouts as aiohttp's (immutable): made once, not per attempt (measured: 2-9k fewer
#: instructions of ~600k a bulk request).
_client_timeout = functools.lru_cache(maxsize=32)(aiohttp.ClientTimeout)


@functools.lru_cache(maxsize=32)
def _parsed_base(base_url: str) -> tuple[yarl.URL, str]:
    """A client's base URL parsed once (``check_base_url``'s form: no query, fragment or trailing
    slash), and its path to put before each request's."""
    base = yarl.URL(base_url, encoded=True)
    return base, "" if base.raw_path == "/" else base.raw_path


def _request_url(base_url: str, target: str) -> yarl.URL:
    """``yarl.URL(base_url + target, encoded=True)``, without parsing the base URL again for
    every request (measured: 12k fewer instructions of ~597k a bulk request)."""
    if "?" in target:  # a query (format=, url=): rare in a bulk call, parsed whole
        return yarl.URL(base_url + target, encoded=True)
    base, prefix = _parsed_base(base_url)
    return base.with_path(prefix + target, encoded=True)


#: The phases of an attempt the record tells apart (see ``_call``): what it was doing last.
PREPARE, CONNECTION, ADMIT, SEND, READ = range(1, 6)


class Attempt:
    """The record of one attempt: how far it got, written where each phase happens.

    ``phase`` is the phase under way. ``admitted`` counts the requests of the attempt its rate
    limit let out, ``sent`` those that went out (aiohttp ran its step that connects, writes the
    request and reads the answer's head: with a caller's session, which runs no recorder, every
    request handed to aiohttp): past the first, each followed a redirect, an answer.

    For the request under way, the SDK's own client middlewares record what aiohttp did:
    ``__call__`` is the innermost one and sees exactly that step (``sends`` counts the times it
    was asked to run: a second one is refused, since aiohttp resends an idempotent request once
    by itself when a kept-alive connection fails, and a middleware may call ``handler()`` twice;
    the client's own retry loop decides retries), ``response`` is the answer once its head came
    back, ``error`` what the step raised. ``outer``, the outermost one (with middlewares of the
    client only: ``__call__`` is alone otherwise, and outermost too), keeps a middleware's own
    connection error raised after the answer from aiohttp, which would take it for a stale
    connection and run every middleware again. (aiohttp's TraceConfig signals could record it
    too, at ~15% of a request's CPU.)
    """

    __slots__ = ("admitted", "cancelled", "error", "phase", "response", "sends", "sent")

    def __init__(self) -> None:
        self.phase = PREPARE
        self.admitted = self.sent = 0
        self.next_request()

    def next_request(self) -> None:
        """Begin recording the next request of the attempt."""
        self.cancelled = False  # a cancellation went through every middleware (aiohttp's timer)
        self.sends = 0
        self.response: aiohttp.ClientResponse | None = None
        self.error: BaseException | None = None

    @property
    def went_out(self) -> bool:
        """Whether the attempt reached phase 4 (its first request, or a later one of it)."""
        return self.sent > 0 or self.phase >= SEND

    def send(self, hop: int, own: bool) -> None:
        """Phase 4 of request ``hop`` (0: the attempt's first, then its redirects)."""
        self.phase = SEND
        if hop:
            self.next_request()
        self.sent += not own  # a caller's session's: handed to aiohttp, all it lets us know

    def chain(self, middlewares: tuple[Any, ...]) -> tuple[Any, ...]:
        """The middlewares of one request, the recorders around the client's own."""
        # With none of the client's, __call__ is outermost too: aiohttp calls a lone middleware
        # without wrappers (measured: 29k fewer instructions a request, of 640k). Not kept on
        # self: a cycle, which only the GC would free.
        return (self.outer, *middlewares, self) if middlewares else (self,)

    async def __call__(
        self, request: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType
    ) -> aiohttp.ClientResponse:
        self.sends += 1
        if self.sends > 1:  # what is raised does not matter: the record says what happened
            raise RuntimeError("asyncsearch sends a request once per attempt")
        self.sent += 1
        try:
            self.response = await handler(request)
        except BaseException as exc:
            self.error = exc
            self.cancelled = isinstance(exc, asyncio.CancelledError)  # outer has the last say
            raise
        return self.response

    async def outer(
        self, request: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType
    ) -> aiohttp.ClientResponse:
        try:
            return await handler(request)
        except BaseException as exc:
            self.cancelled = isinstance(exc, asyncio.CancelledError)
            if self.response is None or not isinstance(exc, aiohttp.ClientError):
                raise
            raise _Kept from exc  # not a ClientError: aiohttp passes it on as it is


class _Kept(Exception):
    """Carries (as its cause) a middleware's own aiohttp error raised after the answer."""


class Transport:
    """Sends attempts over one ``aiohttp.ClientSession``, created lazily inside the running loop.

    A session passed in is used as it is and never closed here. ``proxy`` and ``proxy_auth``
    are the own session's (aiohttp's keywords), checked here without quoting them.
    """

    def __init__(
        self,
        session: aiohttp.ClientSession | None,
        max_connections: int,
        trust_env: bool,
        proxy: str | yarl.URL | None,
        proxy_auth: aiohttp.BasicAuth | None,
    ) -> None:
        if session is not None and not isinstance(session, aiohttp.ClientSession):
            raise ConfigurationError("session must be an aiohttp.ClientSession")
        if session is not None and (proxy is not None or proxy_auth is not None):
            raise ConfigurationError("proxy cannot be given with session=, which has its own")
        if not isinstance(proxy_auth, aiohttp.BasicAuth | None) or (proxy_auth and not proxy):
            raise ConfigurationError("proxy_auth must be an aiohttp.BasicAuth, given with proxy=")
        #: ``secrets``: the proxy's credentials in every form the client knows them (``Secrets``).
        self._proxy, self._proxy_headers, self.secrets = _proxy_of(proxy, proxy_auth)
        self._session = session
        #: True when the session is this transport's own (no ``session=`` was passed).
        self.owns_session = session is None
        self._max_connections = max_connections
        self._trust_env = trust_env
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        # The pool's free connections when this transport owns the session; None for a caller's
        # session, which keeps its own limits (aiohttp queues in its connector then).
        self.pool = Slots(max_connections) if session is None else None

    @property
    def closed(self) -> bool:
        """True once ``aclose`` was called (or a passed-in session was closed)."""
        return self._closed or (
            not self.owns_session and self._session is not None and self._session.closed
        )

    @property
    def pool_size(self) -> int | None:
        """How many requests this transport sends at once at most; None when unbounded."""
        if self.pool is not None:
            return self.pool.limit
        connector = None if self._session is None else self._session.connector
        limits = [n for n in (connector.limit, connector.limit_per_host) if n] if connector else []
        return min(limits, default=None)

    def _get_session(self) -> aiohttp.ClientSession:
        if self._closed:
            raise ClientClosedError("the client is closed")
        # Refuse an event loop other than the first one used: its sockets belong to that one.
        loop = running_loop()
        if self._loop is None:
            self._loop = loop
        elif loop is not self._loop:
            raise EventLoopMismatchError(
                "the client is used from another event loop than the one it was first used in; "
                "create one client per event loop"
            )
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._max_connections),
                trust_env=self._trust_env,
                # Decompression happens in _read_body, in bounded steps, so that a gzip bomb
                # cannot blow up memory.
                auto_decompress=False,
                # The service authenticates by key: the client keeps no cookies, so a request
                # never carries state from an earlier answer (a caller's session keeps its own).
                cookie_jar=aiohttp.DummyCookieJar(),
                proxy=self._proxy,
            )
        elif self._session.closed:
            raise ClientClosedError("the aiohttp session passed to the client is closed")
        return self._session

    async def aclose(self) -> None:
        """Close the session if this transport created it; further sends raise.

        Raises ``ClientClosedError``, changing nothing, from another event loop than the one the
        session was made in.
        """
        session = self._session if self.owns_session else None
        # The session's connections belong to its loop and can only be closed from it.
        if session is not None and not session.closed and running_loop() is not self._loop:
            gone = self._loop is not None and self._loop.is_closed()
            raise EventLoopMismatchError(
                "aclose() was called from another event loop than the one the client was first "
                "used in; close the client from that loop, before it ends"
                + (" (it has ended, so its connections could not be closed)" if gone else "")
            )
        self._closed = True
        self._session = None
        if self.pool is not None:
            self.pool.close(
                lambda: ClientClosedError("the client was closed while the request waited")
            )
        if session is not None:
            await session.close()  # does nothing when it is closed already

    async def send(
        self,
        request: Request[Any],
        options: Options,
        record: Attempt,
        *,
        bulk: bool = False,
        admit: Callable[[Attempt], Awaitable[None]] | None = None,
    ) -> Response:
        """Send one attempt of ``request`` under a call's ``options``; the final response, read.

        Args:
            request: what to send.
            options: the call's: the base URL, headers, ``timeout``, the body's cap, redirects,
                ``ssl`` and the ``middlewares`` run on each request sent (a redirect followed is
                another; none given, the session's own run).
            record: the attempt's record, written as each phase happens.
            bulk: wait for a connection of the pool without ``Timeout.pool`` (a bulk call's
                requests queue for it; their deadline and closing the client still end the wait).
            admit: awaited before each request goes out, with its connection in hand (the call's
                rate limit).

        Raises:
            APIConnectionError: the request failed on the wire (``APITimeoutError`` for its
                timeouts, ``ProxyError`` when the proxy refused it).
            PoolTimeoutError: no pooled connection freed up within ``timeout.pool`` (nothing was
                sent).
            ResponseTooLargeError: the body passed the size cap.
            APIStatusError: a redirect loop.
            MiddlewareError: a middleware sent the request twice.
            ClientClosedError: the client is (or gets) closed.
            Exception: a middleware's own error, as it raised it.
        """
        session = self._get_session()
        pool = self.pool
        record.phase = CONNECTION
        if pool is not None and not pool.take():
            await _wait_for(pool, None if bulk else options.timeout.pool)
        try:
            # Only now, with a connection of the pool, do ``total`` (aiohttp's timer, armed by
            # session.request) and ``elapsed`` start.
            return await _follow_redirects(
                session,
                request,
                options,
                record,
                admit,
                own=pool is not None,
                proxy=self._proxy_headers,
            )
        except Exception as exc:
            # Closed while in flight: the closing broke the attempt, whatever it raised then (an
            # answer that came, as a status error, is still that answer's).
            broken = isinstance(exc, APIConnectionError) or not isinstance(exc, AsyncSearchError)
            if broken and self.closed:
                raise ClientClosedError(
                    "the client was closed while the request was in flight"
                ) from None
            raise
        finally:
            if pool is not None:
                pool.release()


async def _wait_for(pool: Slots, limit: float | None) -> None:
    """Wait in line for a connection of the pool, at most ``limit`` seconds (``None``: no limit).

    As in httpcore's pool, waiting for a connection happens inside the attempt: a direct call
    waits at most ``Timeout.pool``, a bulk call without a limit but its deadline (which cancels
    the wait); closing the client ends every wait (``ClientClosedError``). aiohttp's connector
    has the same limit, so it never queues: its own queue would count against ``connect`` and
    ``total``.
    """
    try:
        with anyio.fail_after(limit):
            await pool.acquire()
    except TimeoutError:
        raise PoolTimeoutError(
            f"no connection of the pool (max_connections={pool.limit}) became free within "
            f"Timeout.pool={limit:g}s; the request was not sent. Send fewer requests at once, "
            "or raise max_connections or Timeout.pool"
        ) from None


async def _follow_redirects(
    session: aiohttp.ClientSession,
    request: Request[Any],
    options: Options,
    record: Attempt,
    admit: Callable[[Attempt], Awaitable[None]] | None,
    *,
    own: bool,
    proxy: Mapping[str, str] | None = None,
) -> Response:
    """Send the attempt, following same-origin redirects, and read the final response."""
    method, url, body = request.method, options.base_url + request.target, request.body
    headers = options.headers_without_body if body is None else options.headers_with_body
    if proxy is not None and url.startswith("http:"):
        # A plain-http request to the proxy carries its credentials itself: aiohttp sends
        # proxy_headers only with the CONNECT of an https:// service's tunnel.
        headers = {**headers, **proxy}
    timeout = options.timeout
    client_timeout = _client_timeout(
        total=timeout.total, sock_connect=timeout.connect, sock_read=timeout.read
    )
    inflate = not session.auto_decompress  # else the session inflates, aiohttp's default
    started = time.monotonic()
    status = 0
    parsed = _request_url(options.base_url, request.target)
    for hop in range(options.max_redirects + 1):
        if admit is not None:  # phase 3: the call lets the request out (its rate-limit token)
            record.phase = ADMIT
            await admit(record)
            record.admitted += 1
        record.send(hop, own)
        try:
            async with session.request(
                method,
                parsed,
                data=body,
                timeout=client_timeout,
                allow_redirects=False,
                headers=headers,
                ssl=options.ssl if options.ssl is not None else True,
                proxy_headers=proxy,  # the proxy's credentials, when the client has a proxy
                # None: a caller's session runs its own (a list here would replace them).
                middlewares=record.chain(options.middlewares) if own else None,
            ) as resp:
                record.phase = READ
                location = resp.headers.get("Location") if resp.status in _REDIRECTS else None
                target = None if location is None else redirect_target(url, location)
                if target is None:
                    try:
                        return await _response(resp, url, started, options, inflate=inflate)
                    except AsyncSearchError:
                        raise
                    except Exception as exc:  # reading the body: the request went out
                        raise _translate(exc, sent=True) from exc
                status = resp.status
                resp.release()
        except AsyncSearchError:
            raise
        except Exception as exc:
            failure = classify(exc, record if own else None)
            if record.response is not None:
                record.response.close()  # an answer a failing middleware held keeps no connection
            if failure is exc:
                raise
            if not isinstance(exc, _Kept):
                raise failure from (exc if not own or record.error is None else record.error)
        else:
            if status == 303 or (status in (301, 302) and method == "POST"):
                method, body = "GET", None
            url = target
            parsed = yarl.URL(url, encoded=True)
            continue
        raise failure  # a middleware's own error, out of the wrapper that kept it from aiohttp
    raise status_error(
        Response(status=status, headers={}, body=b"", url=url),
        method=request.method,  # the call's, as in every status error (a 303 sent a GET)
        attempts=None,
        reason=f"more than {options.max_redirects} redirects (a redirect loop?)",
    )


def _proxy_of(
    proxy: object, auth: aiohttp.BasicAuth | None
) -> tuple[yarl.URL | None, Mapping[str, str] | None, frozenset[str]]:
    """The proxy's URL, its credentials as the ``Proxy-Authorization`` header sent with each
    request, and every form of them to scrub (``Secrets``).

    Credentials in its URL move to the header, where no error of aiohttp quotes them. (Made here,
    not by aiohttp's ``BasicAuth`` or its ``proxy_auth``, both deprecated by aiohttp 3.14.) A proxy
    that is not an http(s) URL is refused without quoting it.
    """
    try:
        url = None if proxy is None else yarl.URL(proxy)  # type: ignore[arg-type]  # checked
    except (TypeError, ValueError):
        url = yarl.URL()
    if url is not None and (url.scheme not in ("http", "https") or not url.host):
        raise ConfigurationError("proxy must be an http:// or https:// URL (a str or a yarl.URL)")
    header, forms = None, set()
    if url is not None and url.user is not None:
        password = url.password or ""
        header = "Basic " + base64.b64encode(f"{url.user}:{password}".encode()).decode()
        forms = _forms(password, url.raw_password)
        url = url.with_user(None)
    if auth is not None:
        header = auth.encode()
        forms |= _forms(auth.password)
    if header is None:
        return url, None, frozenset(forms)
    return url, {"Proxy-Authorization": header}, frozenset({*forms, header.split(" ")[-1]})


def _forms(password: str, *raw: str | None) -> set[str]:
    """A proxy's password, as given and percent-encoded (and ``raw``, as its URL gave it): with
    the base64 of its header, every form a text may show the credentials in (``user:password``
    holds the password)."""
    return {password, quote(password, safe=""), *(r for r in raw if r)} if password else set()


def classify(exc: Exception, record: Attempt | None) -> BaseException:
    """What to raise for ``exc``, raised by ``session.request`` (its middlewares included).

    ``record`` says what happened on the wire (``None``: a caller's session, unrecorded: then
    the exception's type is all there is). An error that aiohttp raised for the request is
    translated, ``request_sent`` as the record shows: only inside the step that connects, writes
    and reads the head does its type tell whether anything went out. An error a middleware
    raised itself (before sending, instead of it, or after the answer) is raised as it is.
    """
    if record is None:
        return _translate(exc) if isinstance(exc, _AIOHTTP_ERRORS) else exc
    if isinstance(exc, _Kept) and isinstance(exc.__cause__, Exception):
        cause, answer = exc.__cause__, record.response
        if isinstance(cause, aiohttp.ClientPayloadError) and answer and answer.content.exception():
            # The answer's body, cut while a middleware read it: the request went out.
            return _translate(cause, sent=True)
        return cause
    if record.sends > 1:
        if record.response is None and isinstance(record.error, Exception):
            return _translate(record.error, sent=True)  # aiohttp's resend, refused
        return MiddlewareError(
            "a client middleware sent the request a second time (it called handler() again, "
            "after an answer); asyncsearch sends each attempt once and makes retries itself"
        )
    # aiohttp's total timer: a TimeoutError once its cancellation went through the middlewares
    # (a middleware's own asyncio.timeout raises one too, but stops the cancellation itself).
    timer = isinstance(exc, TimeoutError) and record.cancelled
    inner = record.error
    if timer or (inner is not None and (exc is inner or exc.__cause__ is inner)):
        # Connect-phase errors say by their type that nothing went out, unless an earlier
        # request of this attempt was answered; the timer may fire before anything was sent.
        went_out = record.sent > 1 or record.response is not None or (timer and record.sends)
        return _translate(exc, sent=True if went_out else None if record.sends else False)
    return exc


#: What aiohttp raises for a request (an OSError may come through as it is).
_AIOHTTP_ERRORS = (aiohttp.ClientError, OSError, TimeoutError)


async def _response(
    resp: aiohttp.ClientResponse, url: str, started: float, options: Options, *, inflate: bool
) -> Response:
    """The final response of an attempt, its body read under ``options.max_response_bytes``
    (and inflated here with ``inflate``)."""
    limit = options.max_response_bytes
    length = resp.content_length
    ok = 200 <= resp.status < 300
    if ok and length is not None and length <= limit and "Content-Encoding" not in resp.headers:
        # The usual answer, read inline: bounded by its Content-Length (aiohttp ends the payload
        # there), nothing to inflate.
        content = await resp.read()
    elif ok:
        try:
            content = await _read_body(resp, limit, inflate)
        except AsyncSearchError as exc:  # too large, or an unknown encoding
            exc.request_id = request_id(resp.headers)
            raise
    else:
        # An error body only feeds the error's message: a huge one (a proxy's HTML page) is cut,
        # and one in an unknown or corrupt encoding is dropped, so the status still decides (a
        # 5xx is still retried). A connection that fails while it is read is still an error.
        try:
            content = await _read_body(resp, min(limit, _ERROR_BODY_LIMIT), inflate, cut=True)
        except AsyncSearchError:  # raised by the decoding in _read_body: only the message is lost
            content = b""
        except aiohttp.ClientPayloadError as exc:
            if not isinstance(exc.__cause__, http_exceptions.ContentEncodingError):
                raise
            content = b""  # the caller's inflating session could not decode it
    # The headers as received: the client scrubs them where they leave it (APIResponse.headers,
    # errors), so a bulk fetch, which never looks at them, does not pay for it.
    return Response(
        status=resp.status,
        headers=resp.headers,
        body=content,
        url=url,
        elapsed=time.monotonic() - started,
    )


async def _read_body(
    resp: aiohttp.ClientResponse, limit: int, inflate: bool, *, cut: bool = False
) -> bytes:
    """Read the whole body, refusing more than ``limit`` bytes; with ``inflate`` a gzip or deflate
    body is inflated here, in bounded steps.

    With ``cut`` a longer body is not an error: its first ``limit`` bytes are returned.
    """
    # When the session inflates bodies itself (a caller's session, aiohttp's default), the bytes
    # it hands over are counted instead, and a Content-Length (of the compressed bytes) decides
    # nothing.
    sent = resp.headers.get("Content-Encoding", "")
    encoding = sent.strip().lower()
    decompressor = None
    if encoding in ("", "identity"):
        declared = resp.content_length
        if declared is not None:
            if declared <= limit:
                # aiohttp ends the payload at Content-Length, so this one read is bounded too.
                return await resp.read()
            if not cut:
                raise _too_large(limit)
    elif inflate and encoding in ("gzip", "x-gzip", "deflate"):
        # 32 + MAX_WBITS accepts both gzip and zlib headers; raw deflate is retried below.
        decompressor = zlib.decompressobj(32 + zlib.MAX_WBITS)
    elif inflate or not (sent.isascii() and sent.lower() in _SESSION_INFLATES):
        raise ResponseValidationError(
            f"the response uses an unsupported Content-Encoding {encoding!r}", path=None, body=b""
        )
    body = bytearray()
    raw_deflate_tried = False
    chunk = b""  # after the loop: the last chunk read, empty when there was none
    # A middleware that read the body (resp.read(), .text(), .json()) left it in memory and the
    # stream at its end: the same bytes, still inflated and capped here.
    at_end = resp.content.at_eof()
    chunks = _held(await resp.read()) if at_end else resp.content.iter_chunked(_CHUNK)
    try:
        async for chunk in chunks:
            data = chunk
            while decompressor is not None:
                try:
                    # At most one byte past the limit: what is left of the chunk then (its
                    # unconsumed_tail) is never needed, the body being too large already.
                    data = decompressor.decompress(chunk, limit - len(body) + 1)
                    break
                except zlib.error:
                    if encoding != "deflate" or raw_deflate_tried or body:
                        raise APIConnectionError(
                            f"the response body is not valid {encoding} data"
                        ) from None
                    # Some servers send raw deflate without the zlib header.
                    raw_deflate_tried = True
                    decompressor = zlib.decompressobj(-zlib.MAX_WBITS)
            body += data
            if _past(body, limit, cut):
                return bytes(body)
    except aiohttp.ClientPayloadError as exc:
        if isinstance(exc.__cause__, _SessionInflateLimitError):
            # A bomb that the caller's session stopped first: too large, not a broken connection.
            raise ResponseTooLargeError(
                f"the response body inflates past the session's own limit ({exc.__cause__})",
                limit=limit,
            ) from None
        raise
    if decompressor is not None:
        body += decompressor.flush()
        if _past(body, limit, cut):
            return bytes(body)
        if chunk and not decompressor.eof:
            # A stream cut before its end: its checksum was never read, so the data is suspect.
            raise APIConnectionError(f"the response body ended before its {encoding} data did")
    return bytes(body)


async def _held(body: bytes) -> AsyncIterator[bytes]:
    yield body


def _past(body: bytearray, limit: int, cut: bool) -> bool:
    """True when ``body`` holds more than ``limit`` bytes, then cut to them (with ``cut``; else
    ``ResponseTooLargeError``)."""
    if len(body) <= limit:
        return False
    if not cut:
        raise _too_large(limit)
    del body[limit:]
    return True


def _too_large(limit: int) -> ResponseTooLargeError:
    return ResponseTooLargeError(
        f"the response body is larger than max_response_bytes ({limit} bytes)", limit=limit
    )


#: What each aiohttp error says happened (the first match wins; every timeout is
#: ``APITimeoutError``).
_MESSAGES: dict[type[BaseException], str] = {
    aiohttp.ConnectionTimeoutError: "timed out connecting",
    aiohttp.SocketTimeoutError: "timed out waiting for data from the server",
    TimeoutError: "the request ran past its total timeout",
    aiohttp.ClientSSLError: "TLS failed",
    aiohttp.ClientConnectorError: "connection failed",
    aiohttp.ClientPayloadError: "the response body was cut or malformed",
    aiohttp.ServerDisconnectedError: "the server closed the connection without answering",
    aiohttp.ClientResponseError: "the server sent a malformed response",
    Exception: "connection failed",
}
#: Raised only while aiohttp opens the connection (DNS, connect, TLS handshake), before any byte
#: of the request is written: the server cannot have acted on it.
_CONNECTING = (aiohttp.ConnectionTimeoutError, aiohttp.ClientConnectorError)


def _translate(exc: Exception, *, sent: bool | None = None) -> AsyncSearchError:
    """Map an aiohttp or OS error to the asyncsearch error a caller can act on.

    ``sent``: whether the request went out, as recorded (``None``: judged by the type, as for a
    caller's session: the connect-phase types say it did not).
    """
    detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    if isinstance(exc, aiohttp.ClientConnectorCertificateError | aiohttp.InvalidURL):
        what = "TLS certificate verification failed (not retried)"
        if isinstance(exc, aiohttp.InvalidURL):
            what = "invalid URL"
        return APIConnectionError(f"{what}: {detail}", retryable=False, request_sent=False)
    if isinstance(exc, aiohttp.ClientHttpProxyError):
        # The proxy's answer to the CONNECT of an https:// service's tunnel: nothing went on.
        return ProxyError(
            f"the proxy refused to open a tunnel to the service: {exc.status} {exc.message}",
            status_code=exc.status,
        )
    what = next(message for kind, message in _MESSAGES.items() if isinstance(exc, kind))
    kind = APITimeoutError if isinstance(exc, TimeoutError) else APIConnectionError
    # A connect-phase type sent nothing, unless the record says otherwise (a redirect answered).
    sent = sent is True if isinstance(exc, _CONNECTING) else sent is not False
    return kind(f"{what}: {detail}", request_sent=sent)
