"""The one place that touches aiohttp: owns the session, sends one attempt, maps every error.

One attempt means: take a free connection of the pool (waiting at most ``Timeout.pool``,
except for a bulk call, which queues its own requests), send the request, follow same-origin
redirects (never carrying the key anywhere else), read the whole body under
``max_response_bytes`` and hand back a ``Response`` value. Every aiohttp and OS error becomes an
asyncsearch error, with any request headers scrubbed from what it carries.
"""

from __future__ import annotations

# This module is asyncio through and through (aiohttp runs on nothing else), so it uses asyncio's
# own primitives and imports no anyio.
import asyncio
import sys
import time
import zlib
from collections.abc import Mapping
from typing import Any

import aiohttp
import yarl
from aiohttp import http_exceptions
from multidict import CIMultiDict, CIMultiDictProxy

from ._checks import running_loop
from ._config import Options
from ._errors import (
    APIConnectionError,
    APITimeoutError,
    AsyncSearchError,
    ClientClosedError,
    ConfigurationError,
    EventLoopMismatchError,
    PoolTimeoutError,
    ResponseTooLargeError,
    ResponseValidationError,
)
from ._protocol import Request, Response, redact, redirect_target, request_id, status_error
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


class _ResendRefused(Exception):
    """Raised into aiohttp when it is about to send an attempt a second time by itself."""


# Only aiohttp's public API is used: every attempt goes through ``session.request`` with the read
# timeout aiohttp keeps, and the one thing the client needs that aiohttp has no option for (not
# resending a request by itself) is done in ``connect`` of this connector subclass, which only
# counts. ``session.request`` resends an idempotent request once, on a new connection, when the
# server closes or resets the one it was sent on (RFC 9112 section 9.3.1). The client's own
# retry loop decides about retries (it counts them against ``max_retries`` and the retry
# budget, and backs off), so on the session made here that hidden resend is refused where it
# starts: when aiohttp asks for a second connection for the same attempt, before a byte of it
# is sent. aiohttp has no public switch for it; ``connect`` is the connector's documented
# entry point, and this only counts and delegates.
class _Connector(aiohttp.TCPConnector):
    """aiohttp's connector, refusing a second connection for one attempt."""

    def __init__(self, *, limit: int) -> None:
        super().__init__(limit=limit)
        # The attempts in flight, by the id() of their ClientTimeout -> connections taken. The
        # session hands the request's `timeout` object to `connect` as it is: made once per
        # attempt, it names the attempt. (A contextvar named it before: setting one made every
        # callback aiohttp schedules copy a non-empty context, ~5 us per request, with more
        # garbage collections. A TraceConfig could count too, at ~15% of a bare request.)
        self.attempts: dict[int, int] = {}

    async def connect(
        self, req: Any, traces: Any, timeout: aiohttp.ClientTimeout
    ) -> aiohttp.connector.Connection:
        key = id(timeout)
        taken = self.attempts.get(key)
        if taken is not None:
            if taken:
                raise _ResendRefused
            self.attempts[key] = 1
        return await super().connect(req, traces, timeout)


class Transport:
    """Sends attempts over one ``aiohttp.ClientSession``, created lazily inside the running loop.

    A session passed in is used as it is and never closed here.
    """

    def __init__(
        self,
        *,
        session: aiohttp.ClientSession | None,
        max_connections: int,
        trust_env: bool,
    ) -> None:
        if session is not None and not isinstance(session, aiohttp.ClientSession):
            raise ConfigurationError("session must be an aiohttp.ClientSession")
        self._session = session
        #: True when the session is this transport's own (no ``session=`` was passed).
        self.owns_session = session is None
        self._max_connections = max_connections
        self._trust_env = trust_env
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        # The pool's free connections when this transport owns the session. Waiting for one
        # happens here, not inside aiohttp, so that ``Timeout.pool`` bounds it (aiohttp counts
        # its own queue against ``connect`` and ``total``) and ``total`` starts only once the
        # attempt has a connection. The connector has the same limit: it never has to queue.
        # (An asyncio.Semaphore binds to the loop that first waits on it, not to this one.)
        # None for a caller's session. A bulk call's gate takes its connections here (see
        # ``send(queued=True)``).
        self.pool = asyncio.Semaphore(max_connections) if session is None else None

    @property
    def closed(self) -> bool:
        """True once ``aclose`` was called (or a passed-in session was closed)."""
        return self._closed or (
            not self.owns_session and self._session is not None and self._session.closed
        )

    @property
    def pool_size(self) -> int | None:
        """How many requests this transport sends at once at most; None when unbounded."""
        if self.owns_session:
            return self._max_connections
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
                connector=_Connector(limit=self._max_connections),
                trust_env=self._trust_env,
                # Decompression happens in _read_body, in bounded steps, so that a gzip bomb
                # cannot blow up memory.
                auto_decompress=False,
                # The service authenticates by key: the client keeps no cookies, so a request
                # never carries state from an earlier answer (a caller's session keeps its own).
                cookie_jar=aiohttp.DummyCookieJar(),
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
        if session is not None:
            await session.close()  # does nothing when it is closed already

    async def send(
        self, request: Request[Any], options: Options, *, queued: bool = False
    ) -> Response:
        """Send one attempt of ``request`` under a call's ``options``; the final response, read.

        From ``options``: the base URL, headers, ``timeout``, the body's cap, redirects, ``ssl``,
        the key (scrubbed from errors) and the ``middlewares`` run on each request sent (a
        redirect followed is another; none given, the session's own run).
        ``queued``: the caller holds a connection of the pool already (a bulk call's gate took
        one from ``pool``, without a time limit), so the attempt does not wait for one here.

        Raises ``APIConnectionError``/``APITimeoutError`` for transport failures,
        ``PoolTimeoutError`` when no pooled connection frees up within ``timeout.pool`` (nothing
        was sent), ``ResponseTooLargeError`` past the size cap, ``APIStatusError`` for a redirect
        loop, and ``ClientClosedError`` when the client is (or gets) closed.
        """
        session = self._get_session()
        pool = None if queued else self.pool
        if pool is not None:
            await self._wait_for_pool(pool, options.timeout.pool)
        try:
            # Only now, with a connection of the pool, do ``total`` (aiohttp's timer, armed by
            # session.request) and ``elapsed`` start.
            return await _follow_redirects(session, request, options)
        except AsyncSearchError:
            raise
        except Exception as exc:
            if self.closed:
                raise ClientClosedError(
                    "the client was closed while the request was in flight"
                ) from None
            raise _translate(exc, options.api_key.get()) from exc
        finally:
            if pool is not None:
                pool.release()

    async def _wait_for_pool(self, pool: asyncio.Semaphore, limit: float | None) -> None:
        if not pool.locked():
            await pool.acquire()  # free: returns without suspending
            return
        try:
            async with asyncio.timeout(limit):
                await pool.acquire()
        except TimeoutError:
            if self.closed:
                raise ClientClosedError("the client was closed while the request waited") from None
            raise PoolTimeoutError(
                f"no connection of the pool (max_connections={self._max_connections}) became "
                f"free within Timeout.pool={limit:g}s; the request was not sent. Send fewer "
                "requests at once, or raise max_connections or Timeout.pool"
            ) from None


async def _follow_redirects(
    session: aiohttp.ClientSession, request: Request[Any], options: Options
) -> Response:
    """Send the attempt, following same-origin redirects, and read the final response."""
    method, url, body = request.method, options.base_url + request.target, request.body
    headers = options.headers_without_body if body is None else options.headers_with_body
    timeout = options.timeout
    # One per attempt, never shared: _Connector knows the attempt by it.
    client_timeout = aiohttp.ClientTimeout(
        total=timeout.total, sock_connect=timeout.connect, sock_read=timeout.read
    )
    # A caller's session resends as aiohttp does: its count goes to a dict nobody reads.
    attempts = session.connector.attempts if isinstance(session.connector, _Connector) else {}
    key = id(client_timeout)
    inflate = not session.auto_decompress  # else the session inflates, aiohttp's default
    started = time.monotonic()
    status = 0
    try:
        for _ in range(options.max_redirects + 1):
            attempts[key] = 0  # a fresh count for each request sent (a redirect is another)
            async with session.request(
                method,
                yarl.URL(url, encoded=True),
                data=body,
                timeout=client_timeout,
                allow_redirects=False,
                headers=headers,
                ssl=options.ssl if options.ssl is not None else True,
                middlewares=options.middlewares or None,  # None: the session's own
            ) as resp:
                location = resp.headers.get("Location") if resp.status in _REDIRECTS else None
                target = None if location is None else redirect_target(url, location)
                if target is None:
                    return await _response(resp, url, started, options, inflate=inflate)
                status = resp.status
                resp.release()
                if status == 303 or (status in (301, 302) and method == "POST"):
                    method, body = "GET", None
                url = target
    finally:
        attempts.pop(key, None)
    raise status_error(
        Response(status=status, headers={}, body=b"", url=url),
        method=request.method,  # the call's, as in every status error (a 303 sent a GET)
        attempts=None,
        secret=options.api_key.get(),
        reason=f"more than {options.max_redirects} redirects (a redirect loop?)",
    )


async def _response(
    resp: aiohttp.ClientResponse, url: str, started: float, options: Options, *, inflate: bool
) -> Response:
    """The final response of an attempt, its body read under ``options.max_response_bytes``
    (and inflated here with ``inflate``)."""
    limit = options.max_response_bytes
    if 200 <= resp.status < 300:
        try:
            content = await _read_body(resp, limit, inflate)
        except AsyncSearchError as exc:  # too large, or an unknown encoding
            exc.request_id = request_id(scrub_headers(resp.headers, options.api_key.get()))
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
    try:
        async for chunk in resp.content.iter_chunked(_CHUNK):
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


def _scrub(exc: BaseException, secret: str) -> None:
    """Remove request headers (which hold the API key) from what an aiohttp error carries."""
    info = getattr(exc, "request_info", None)
    if isinstance(info, aiohttp.RequestInfo):
        clean: CIMultiDict[str] = CIMultiDict(
            (k, "[redacted]" if k.lower() == "x-api-key" else redact(v, secret))
            for k, v in info.headers.items()
        )
        scrubbed = aiohttp.RequestInfo(
            info.url, info.method, CIMultiDictProxy(clean), info.real_url
        )
        exc.request_info = scrubbed  # type: ignore[attr-defined]
        # The constructor's arguments are kept in .args too (and pickled from there).
        exc.args = tuple(scrubbed if arg is info else arg for arg in exc.args)
    if hasattr(exc, "history"):
        exc.history = ()
    if secret:  # an error raised by a middleware may quote the request's headers
        exc.args = tuple(redact(a, secret) if isinstance(a, str) else a for a in exc.args)


def scrub_headers(headers: Mapping[str, str], secret: str) -> Mapping[str, str]:
    """Response headers as received, unless the server echoed the key: then with it replaced."""
    # ``Transport.send`` returns the headers as received; the client calls this wherever they
    # leave it (``APIResponse.headers``, the errors it raises).
    # One search in the joined values instead of one per value; NUL cannot be part of a key
    # (the client refuses it), so no match can straddle two values.
    if not secret or secret not in "\x00".join(headers.values()):
        return headers
    return CIMultiDictProxy(CIMultiDict((k, redact(v, secret)) for k, v in headers.items()))


def _translate(exc: Exception, secret: str) -> AsyncSearchError:
    """Map an aiohttp or OS error to the asyncsearch error a caller can act on."""
    if isinstance(exc, _ResendRefused):
        # aiohttp was about to resend because the connection failed after the request went out.
        return APIConnectionError(
            "the server closed the connection without answering (or reset it) after the "
            "request was sent, or a middleware sent the request a second time"
        )
    _scrub(exc, secret)
    detail = redact(f"{type(exc).__name__}: {exc}", secret)
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):
        return APIConnectionError(
            f"TLS certificate verification failed (not retried): {detail}",
            retryable=False,
            request_sent=False,
        )
    # aiohttp raises ConnectionTimeoutError and ClientConnectorError (with its TLS subclasses)
    # only while it opens the connection (DNS, connect, TLS handshake), before any byte of the
    # request is written: the server cannot have acted on it (request_sent=False).
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return APITimeoutError(f"timed out connecting: {detail}", request_sent=False)
    if isinstance(exc, aiohttp.SocketTimeoutError):
        return APITimeoutError(f"timed out waiting for data from the server: {detail}")
    if isinstance(exc, TimeoutError):
        return APITimeoutError(f"the request ran past its total timeout: {detail}")
    if isinstance(exc, aiohttp.ClientSSLError):  # a ClientConnectorError too
        return APIConnectionError(f"TLS failed: {detail}", request_sent=False)
    if isinstance(exc, aiohttp.ClientConnectorError):
        return APIConnectionError(f"connection failed: {detail}", request_sent=False)
    if isinstance(exc, aiohttp.ClientPayloadError):
        return APIConnectionError(f"the response body was cut or malformed: {detail}")
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return APIConnectionError(f"the server closed the connection without answering: {detail}")
    if isinstance(exc, aiohttp.ClientResponseError):
        return APIConnectionError(f"the server sent a malformed response: {detail}")
    if isinstance(exc, aiohttp.InvalidURL):
        return APIConnectionError(f"invalid URL: {detail}", retryable=False)
    if isinstance(exc, aiohttp.ClientError | OSError):
        return APIConnectionError(f"connection failed: {detail}")
    return APIConnectionError(f"unexpected error while sending the request: {detail}")
