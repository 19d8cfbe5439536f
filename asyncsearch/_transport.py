"""The one place that touches aiohttp: owns the session, sends one attempt, maps every error.

One attempt means: take a free connection slot of the pool (waiting at most ``Timeout.pool``),
send the request, follow same-origin redirects (never carrying the key anywhere else), read the
whole body under ``max_response_bytes`` (decompressing it here, in bounded steps, so a gzip bomb
cannot blow up memory), and hand back a ``Response`` value. Every aiohttp and OS error becomes an
asyncsearch error in ``_translate``, with any request headers scrubbed from what it carries.

This module is asyncio through and through (aiohttp runs on nothing else), so it uses asyncio's
own primitives and imports no anyio.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import ssl as ssl_module
import sys
import time
import zlib
from collections import deque
from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import NamedTuple

import aiohttp
import yarl
from aiohttp import http_exceptions
from aiohttp.client_proto import ResponseHandler
from aiohttp.helpers import TimeoutHandle
from multidict import CIMultiDict, CIMultiDictProxy, istr

from ._config import Timeout
from ._errors import (
    APIConnectionError,
    APITimeoutError,
    AsyncSearchError,
    ClientClosedError,
    ConfigurationError,
    PoolTimeoutError,
    ResponseTooLargeError,
    ResponseValidationError,
)
from ._protocol import Response, redact, redirect_target, status_error
from ._version import __version__

__all__ = ["USER_AGENT", "Transport"]

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


class _NeverRaised(Exception):
    """Stands in for an aiohttp error that an older aiohttp does not have."""


#: aiohttp 3.13+ refuses, in a session that inflates, to inflate one chunk past its own limit.
_SessionInflateLimitError: type[Exception] = getattr(
    http_exceptions, "DecompressSizeError", _NeverRaised
)
_ASYNCIO_ONLY = (
    "asyncsearch runs on asyncio only, and no asyncio event loop is running here; "
    "under anyio use anyio.run(..., backend='asyncio'); trio is not supported"
)


class _LazyReadTimer(ResponseHandler):
    """aiohttp's client protocol, with the same read timeout kept by one timer per connection.

    aiohttp cancels its read timer and makes a new one for every chunk it receives, and drops it
    at the end of every answer: at least two ``TimerHandle``s (made, pushed on the loop's heap,
    cancelled) per request, about 15 µs of a 250 µs request in a zero-latency bulk fetch
    (measured). This protocol notes instead whether an answer is being read and when its last
    chunk came, and keeps one timer for the connection, across the answers a keep-alive
    connection carries. When the timer comes due it checks: ``read`` seconds without data while
    an answer is read is the timeout; data came meanwhile, and it is set again for the rest;
    nothing is being read, and it stays unset until the next answer begins. So the timeout
    fires exactly when aiohttp's would, with no timer made or cancelled per request. Installed
    on the client's own connector only when aiohttp's protocol has the parts it replaces (else
    aiohttp's stays).
    """

    _data_at = 0.0  # when the answer being read last got data (or began)
    _due = 0.0  # when the timer set, if any, comes due
    _reading = False  # an answer is being read, and the read timeout applies to it

    def _reschedule_timeout(self) -> None:
        # aiohttp calls this when a request was sent, for every chunk, and on resume_reading.
        timeout = self._read_timeout
        if not timeout:
            self._reading = False
            return
        now = self._loop.time()
        self._data_at = now
        self._reading = True
        handle = self._read_timeout_handle
        if handle is None or self._due > now + timeout:  # none set, or for a longer timeout
            if handle is not None:
                handle.cancel()
            self._due = now + timeout
            self._read_timeout_handle = self._loop.call_at(self._due, self._read_timer_due)

    def _drop_timeout(self) -> None:
        # aiohttp calls this at the end of an answer, on pause_reading and on errors: nothing is
        # read any more, and the timer stays for the connection's next answer.
        self._reading = False

    def connection_lost(self, exc: BaseException | None) -> None:
        handle = self._read_timeout_handle
        if handle is not None:
            # The connection is gone: its timer neither fires nor keeps it alive any longer.
            handle.cancel()
            self._read_timeout_handle = None
        self._reading = False  # set here too: not every aiohttp release drops the timeout here
        super().connection_lost(exc)

    def _read_timer_due(self) -> None:
        self._read_timeout_handle = None
        timeout = self._read_timeout
        if not self._reading or not timeout:
            return  # set again when the next answer begins
        due = self._data_at + timeout
        if due > self._loop.time():  # data came meanwhile: wait for the rest
            self._due = due
            self._read_timeout_handle = self._loop.call_at(due, self._read_timer_due)
        else:
            self._reading = False
            self._on_read_timeout()


def _lazy_read_timer(*, loop: asyncio.AbstractEventLoop) -> ResponseHandler:
    return _LazyReadTimer(loop=loop)


_LAZY_READ_TIMER = all(
    callable(getattr(ResponseHandler, name, None))
    for name in (
        "_reschedule_timeout",
        "_drop_timeout",
        "_on_read_timeout",
        "start_timeout",
        "connection_lost",
    )
)


#: The read buffer of the client's own session, set explicitly so that both request paths use it.
_READ_BUFSIZE = 2**16


def _takes(function: Callable[..., object], *names: str) -> bool:
    """True when ``function`` accepts every one of ``names`` as a keyword."""
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):
        return False
    return all(name in parameters for name in names)


def _genuine_session_request() -> object:
    """aiohttp's own ``ClientSession._request``, or None when something replaced it already."""
    function = aiohttp.ClientSession.__dict__.get("_request")
    code = getattr(function, "__code__", None)
    genuine = (
        inspect.isfunction(function)
        and code is not None
        and code.co_filename == getattr(aiohttp.client, "__file__", None)
    )
    return function if genuine else None


#: What ``session.request`` runs. A request on the client's own session takes the direct path
#: (``_start``) only while this is still ``ClientSession._request``: a tool that patches it
#: (aioresponses, an APM tracer) sees every request, as it would without asyncsearch.
_SESSION_REQUEST = _genuine_session_request()

#: The direct path uses aiohttp's own request machinery below ``ClientSession._request``; it is
#: on only where every part it calls takes the arguments it passes (aiohttp 3.11 to 3.14 do).
_DIRECT_REQUESTS = (
    _SESSION_REQUEST is not None
    and _takes(
        aiohttp.ClientRequest.__init__,
        "headers",
        "data",
        "loop",
        "response_class",
        "timer",
        "session",
        "ssl",
        "traces",
    )
    and _takes(aiohttp.BaseConnector.connect, "traces", "timeout")
    and _takes(
        ResponseHandler.set_response_params,
        "timer",
        "skip_payload",
        "read_until_eof",
        "auto_decompress",
        "read_timeout",
        "read_bufsize",
        "timeout_ceil_threshold",
    )
    and callable(getattr(aiohttp.ClientResponse, "start", None))
    and callable(getattr(TimeoutHandle, "timer", None))
)


class _Direct(NamedTuple):
    """What the direct path needs of the session made here, taken once when it is made."""

    session: aiohttp.ClientSession
    connector: aiohttp.BaseConnector
    loop: asyncio.AbstractEventLoop
    #: The connector's rounding threshold for the read timeout, as session.request passes it.
    ceil_threshold: float


async def _start(
    direct: _Direct,
    method: str,
    url: yarl.URL,
    *,
    headers: CIMultiDictProxy[str],
    body: bytes | None,
    timeout: aiohttp.ClientTimeout,
    ssl: ssl_module.SSLContext | bool,
    decompress: bool,
) -> aiohttp.ClientResponse:
    """What ``session.request`` does for the client's own session, and nothing it never needs.

    ``ClientSession._request`` is one large coroutine that, per request, merges default headers,
    parses and checks the URL, looks for credentials in it, filters the cookie jar, looks up
    proxies, builds trace and middleware lists and a closure: about 70k instructions of the ~460k
    a bare aiohttp request costs (measured with callgrind). The client's own session has no
    default headers, no cookies (a ``DummyCookieJar``), no proxy (``trust_env`` off), no tracing
    and no middleware (``_as_made`` checks it), aiohttp's default header size limits, and URLs
    the client built and checked; so this runs only the steps that remain, in ``_request``'s own
    order and with its own timer: the ``total`` timeout (aiohttp's ``TimeoutHandle``), the
    connection from the pool, the response parameters, sending, and reading the status and
    headers. Its errors are the ones ``_request`` raises, so ``_translate`` maps them alike.
    """
    session, connector, loop, ceil_threshold = direct
    handle_maker = TimeoutHandle(loop, timeout.total, ceil_threshold=timeout.ceil_threshold)
    handle = handle_maker.start()
    timer = handle_maker.timer()
    try:
        with timer:
            request = aiohttp.ClientRequest(
                method,
                url,
                headers=headers,
                data=body,
                loop=loop,
                response_class=aiohttp.ClientResponse,
                timer=timer,
                session=session,
                ssl=ssl,
                traces=[],
            )
            try:
                connection = await connector.connect(request, traces=[], timeout=timeout)
            except TimeoutError as exc:
                raise aiohttp.ConnectionTimeoutError(
                    f"Connection timeout to host {request.url}"
                ) from exc
            protocol = connection.protocol
            assert protocol is not None
            protocol.set_response_params(
                timer=timer,
                skip_payload=request.method == "HEAD",  # aiohttp's EMPTY_BODY_METHODS
                read_until_eof=True,
                auto_decompress=decompress,
                read_timeout=timeout.sock_read,
                read_bufsize=_READ_BUFSIZE,
                timeout_ceil_threshold=ceil_threshold,
            )
            try:
                response = await request.send(connection)
                try:
                    await response.start(connection)
                except BaseException:
                    response.close()
                    raise
            except BaseException:
                connection.close()
                raise
    except BaseException as exc:
        handle_maker.close()
        if handle is not None:
            handle.cancel()
        # As _request does: a bare OSError becomes a ClientOSError (the timer's own
        # TimeoutError, which has no errno, stays what it is).
        if (
            isinstance(exc, OSError)
            and not isinstance(exc, aiohttp.ClientError)
            and not (exc.errno is None and isinstance(exc, TimeoutError))
        ):
            raise aiohttp.ClientOSError(*exc.args) from exc
        raise
    if handle is not None:
        # The total timeout covers reading the body too: it ends with the connection's use.
        if response.connection is not None:
            response.connection.add_callback(handle.cancel)
        else:
            handle.cancel()
    return response


def _as_made(session: aiohttp.ClientSession) -> bool:
    """True when the session made here has nothing that only ``session.request`` applies.

    A tracer (OpenTelemetry's aiohttp instrumentation, Sentry) wraps ``ClientSession.__init__``
    and adds trace configs to every session, this one included; ``trust_env`` looks up proxies
    and netrc per request. Either, or anything else such a wrapper sets (default headers, auth,
    proxy, middleware, another request or response class, a cookie jar), keeps every request of
    the session on ``session.request``.
    """
    return (
        not session.trace_configs
        and not session.trust_env
        and not session.headers
        and session.auth is None
        and getattr(session, "_default_proxy", None) is None
        and getattr(session, "_base_url", None) is None
        and not getattr(session, "_middlewares", ())
        and not getattr(session, "_raise_for_status", False)
        and getattr(session, "_request_class", None) is aiohttp.ClientRequest
        and getattr(session, "_response_class", None) is aiohttp.ClientResponse
        and isinstance(session.cookie_jar, aiohttp.DummyCookieJar)
    )


class _PoolSlots:
    """The free connections of the client's pool: a counter, and callers waiting in line.

    Waiting for a slot happens here, not inside aiohttp, so that ``Timeout.pool`` bounds it and
    ``total`` starts only once the attempt has a connection. A plain counter instead of an
    ``asyncio.Semaphore``: taking a free slot is a synchronous call, with nothing allocated on a
    request's path unless it has to wait.
    """

    __slots__ = ("_free", "_waiters")

    def __init__(self, size: int) -> None:
        self._free = size
        self._waiters: deque[asyncio.Future[None]] = deque()

    def try_take(self) -> bool:
        """Take a slot when one is free and nobody is waiting in line (first come, first served)."""
        if self._free > 0 and not self._waiters:
            self._free -= 1
            return True
        return False

    async def wait(self) -> None:
        """Wait in line for a slot; it is handed over directly by ``give_back``."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                # Handed a slot in the same turn as the cancellation: pass it on.
                self.give_back()
            else:
                waiter.cancel()
            raise

    def give_back(self) -> None:
        """Return a slot: to the first caller still waiting, else to the free count."""
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._free += 1


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
        self._owns_session = session is None
        self._max_connections = max_connections
        self._trust_env = trust_env
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        # The pool's slots when this transport owns the session; a caller's session has its own
        # pool (and aiohttp counts waiting for it against ``total``).
        self._slots: _PoolSlots | None = None
        # The headers and timeout in aiohttp's own types, converted once for the objects they
        # come from: a client passes the same two objects (made once per client options) with
        # every request, and aiohttp copies a plain dict into a case-insensitive one per
        # request (about 2 µs of a 250 µs request) while it takes a CIMultiDictProxy as it is.
        self._headers_of: Mapping[str, str] | None = None
        self._headers: CIMultiDictProxy[str] = CIMultiDictProxy(CIMultiDict())
        self._timeout_of: Timeout | None = None
        self._timeout = aiohttp.ClientTimeout()  # replaced before its first use
        # Set when requests on the session made here take the direct path (see _start).
        self._direct: _Direct | None = None

    @property
    def closed(self) -> bool:
        """True once ``aclose`` was called (or a passed-in session was closed)."""
        # A session made here is closed only by aclose, which sets _closed first: no need to
        # ask aiohttp (two property calls) on every request.
        return self._closed or (
            not self._owns_session and self._session is not None and self._session.closed
        )

    def _get_session(self) -> aiohttp.ClientSession:
        if self._closed:
            raise ClientClosedError("the client is closed")
        self._check_loop()
        if self._session is None:
            self._slots = _PoolSlots(self._max_connections)
            # The same limit as the slots, which are taken first: aiohttp never has to queue.
            connector = aiohttp.TCPConnector(limit=self._max_connections)
            if _LAZY_READ_TIMER and hasattr(connector, "_factory"):
                # One read timer per connection instead of one per chunk (see _LazyReadTimer).
                connector._factory = functools.partial(_lazy_read_timer, loop=_running_loop())
            self._session = aiohttp.ClientSession(
                connector=connector,
                trust_env=self._trust_env,
                # Decompression happens in _read_body, in bounded steps.
                auto_decompress=False,
                # The service authenticates by key: the client keeps no cookies, so a request
                # never carries state from an earlier answer (a caller's session keeps its own).
                cookie_jar=aiohttp.DummyCookieJar(),
                read_bufsize=_READ_BUFSIZE,
            )
            if _DIRECT_REQUESTS and _as_made(self._session):
                self._direct = _Direct(
                    self._session,
                    connector,
                    _running_loop(),
                    getattr(connector, "_timeout_ceil_threshold", 5.0),
                )
            # aiohttp quietly resends an idempotent request once when the server drops the
            # connection. The client's own retry loop decides about retries (and counts them
            # against max_retries and the retry budget), so that hidden resend is turned off.
            if hasattr(self._session, "_retry_connection"):
                setattr(self._session, "_retry_connection", False)  # noqa: B010
        elif self._session.closed:
            raise ClientClosedError("the aiohttp session passed to the client is closed")
        return self._session

    def _check_loop(self) -> None:
        """Refuse an event loop other than the first one used (its sockets belong to that one)."""
        loop = _running_loop()
        if self._loop is None:
            self._loop = loop
        elif loop is not self._loop:
            raise ClientClosedError(
                "the client is used from another event loop than the one it was first used in; "
                "create one client per event loop"
            )

    async def aclose(self) -> None:
        """Close the session if this transport created it; further sends raise.

        From another event loop than the one the session was made in, raises
        ``ClientClosedError`` and changes nothing: the session's connections belong to that loop
        and can only be closed from it.
        """
        session = self._session
        owned_open = session is not None and self._owns_session and not session.closed
        if owned_open and _running_loop() is not self._loop:
            gone = self._loop is not None and self._loop.is_closed()
            raise ClientClosedError(
                "aclose() was called from another event loop than the one the client was first "
                "used in; close the client from that loop, before it ends"
                + (" (it has ended, so its connections could not be closed)" if gone else "")
            )
        self._closed = True
        self._session = None
        self._direct = None
        if owned_open:
            assert session is not None
            await session.close()

    async def send(
        self,
        method: str,
        url: str,
        *,
        headers: Mapping[str, str],
        body: bytes | None,
        timeout: Timeout,
        max_response_bytes: int,
        max_redirects: int,
        ssl: ssl_module.SSLContext | None,
        secret: str,
    ) -> Response:
        """Send one attempt and return the final response, body read in full.

        Raises ``APIConnectionError``/``APITimeoutError`` for transport failures,
        ``PoolTimeoutError`` when no pooled connection frees up within ``timeout.pool`` (nothing
        was sent), ``ResponseTooLargeError`` past the size cap, ``APIStatusError`` for a redirect
        loop, and ``ClientClosedError`` when the client is (or gets) closed.
        """
        session = self._session
        # The usual case in one test: the session made here, open, used from its own loop.
        # Anything else (first use, closed, a caller's session, another loop or none) goes
        # through _get_session, which says what is wrong.
        if (
            session is None
            or self._closed
            or not self._owns_session
            or asyncio._get_running_loop() is not self._loop
        ):
            session = self._get_session()
        slots = self._slots
        if slots is not None and not slots.try_take():
            await self._wait_for_slot(slots, timeout.pool)
        # Only now, with a connection slot, do ``total`` (aiohttp's timer, armed by
        # session.request) and ``elapsed`` start.
        decompress_here = not session.auto_decompress
        if timeout is not self._timeout_of:
            self._timeout = _client_timeout(timeout)
            self._timeout_of = timeout
        client_timeout = self._timeout
        if headers is not self._headers_of:
            # Headers are never changed once handed over (the client's are made per options).
            self._headers = CIMultiDictProxy(CIMultiDict(headers))
            self._headers_of = headers
        aiohttp_headers = self._headers
        ssl_arg = ssl if ssl is not None else True
        direct = self._direct
        started = time.monotonic()
        current_url, current_method, current_body = url, method, body
        last_status = 0
        try:
            for _ in range(max_redirects + 1):
                request_url = yarl.URL(current_url, encoded=True)
                opened: AbstractAsyncContextManager[aiohttp.ClientResponse]
                if direct is not None and aiohttp.ClientSession._request is _SESSION_REQUEST:
                    # The session made here, with nothing patched into aiohttp: see _start.
                    opened = await _start(
                        direct,
                        current_method,
                        request_url,
                        headers=aiohttp_headers,
                        body=current_body,
                        timeout=client_timeout,
                        ssl=ssl_arg,
                        decompress=not decompress_here,
                    )
                else:
                    opened = session.request(
                        current_method,
                        request_url,
                        headers=aiohttp_headers,
                        data=current_body,
                        timeout=client_timeout,
                        allow_redirects=False,
                        ssl=ssl_arg,
                    )
                # A started response closes itself as session.request's context does: released
                # (or closed, when its body was not read to the end), then its writer awaited.
                async with opened as resp:
                    # The status first: most answers are no redirect, and their headers need
                    # no lookup.
                    location = resp.headers.get("Location") if resp.status in _REDIRECTS else None
                    if location is not None:
                        target = redirect_target(current_url, location)
                        if target is not None:
                            last_status = resp.status
                            resp.release()
                            if resp.status == 303 or (
                                resp.status in (301, 302) and current_method == "POST"
                            ):
                                current_method, current_body = "GET", None
                            current_url = target
                            continue
                    if 200 <= resp.status < 300:
                        if _plain_within(resp, max_response_bytes):
                            # aiohttp ends the payload at Content-Length: this read is bounded.
                            content = await resp.read()
                        else:
                            content = await _read_body(resp, max_response_bytes, decompress_here)
                    else:
                        content = await _read_error_body(
                            resp, min(max_response_bytes, _ERROR_BODY_LIMIT), decompress_here
                        )
                    # The headers as received: the client scrubs them where they leave it
                    # (APIResponse.headers, errors), so a bulk fetch, which never looks at
                    # them, does not pay for it.
                    return Response(
                        status=resp.status,
                        headers=resp.headers,
                        body=content,
                        url=current_url,
                        elapsed=time.monotonic() - started,
                    )
            raise status_error(
                Response(status=last_status, headers={}, body=b"", url=current_url),
                method=method,
                attempts=None,
                secret=secret,
                reason=f"more than {max_redirects} redirects (a redirect loop?)",
            )
        except AsyncSearchError:
            raise
        except Exception as exc:
            if self.closed:
                raise ClientClosedError(
                    "the client was closed while the request was in flight"
                ) from None
            raise _translate(exc, secret) from exc
        finally:
            if slots is not None:
                slots.give_back()

    async def _wait_for_slot(self, slots: _PoolSlots, limit: float | None) -> None:
        try:
            async with asyncio.timeout(limit):
                await slots.wait()
        except TimeoutError:
            if self.closed:
                raise ClientClosedError("the client was closed while the request waited") from None
            raise PoolTimeoutError(
                f"no connection of the pool (max_connections={self._max_connections}) became "
                f"free within Timeout.pool={limit:g}s; the request was not sent. Send fewer "
                "requests at once, or raise max_connections or Timeout.pool"
            ) from None


async def _read_error_body(
    resp: aiohttp.ClientResponse, limit: int, decompress_here: bool
) -> bytes:
    """The first ``limit`` bytes of an error body, or ``b""`` when it cannot be decoded.

    An error body only feeds the error's message: a huge one (a proxy's HTML page) is cut, and
    one in an unknown or corrupt encoding is dropped, so the status still decides (a 5xx is still
    retried). A connection that fails while the body is read is still a connection error.
    """
    try:
        return await _read_body(resp, limit, decompress_here, cut=True)
    except AsyncSearchError:
        # Raised by the decoding in _read_body itself: only the message is lost.
        return b""
    except aiohttp.ClientPayloadError as exc:
        if isinstance(exc.__cause__, http_exceptions.ContentEncodingError):
            # The caller's inflating session could not decode it.
            return b""
        raise


_CONTENT_ENCODING = istr("Content-Encoding")  # an istr: looked up without folding its case


def _plain_within(resp: aiohttp.ClientResponse, limit: int) -> bool:
    """The usual answer: no Content-Encoding, and a Content-Length of at most ``limit``."""
    if _CONTENT_ENCODING in resp.headers:
        return False
    declared = resp.content_length
    return declared is not None and declared <= limit


async def _read_body(
    resp: aiohttp.ClientResponse, limit: int, decompress_here: bool, *, cut: bool = False
) -> bytes:
    """Read the whole body, decompressed in bounded steps, refusing more than ``limit`` bytes.

    With ``cut`` a longer body is not an error: its first ``limit`` bytes are returned. When the
    session inflates bodies itself (a caller's session, aiohttp's default), the bytes it hands
    over are counted instead, and a Content-Length (of the compressed bytes) decides nothing.
    """
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
    elif not decompress_here:
        if not (sent.isascii() and sent.lower() in _SESSION_INFLATES):
            raise _unsupported_encoding(encoding)
    elif encoding in ("gzip", "x-gzip", "deflate"):
        # 32 + MAX_WBITS accepts both gzip and zlib headers; raw deflate is retried below.
        decompressor = zlib.decompressobj(32 + zlib.MAX_WBITS)
    else:
        raise _unsupported_encoding(encoding)
    parts: list[bytes] = []
    size = 0

    def full(data: bytes) -> bool:
        """Keep ``data``; True once the limit is reached and the rest can be dropped."""
        nonlocal size
        if size + len(data) > limit:
            if not cut:
                raise _too_large(limit)
            parts.append(data[: limit - size])
            size = limit
            return True
        parts.append(data)
        size += len(data)
        return False

    raw_deflate_tried = False
    received = 0
    try:
        async for chunk in resp.content.iter_chunked(_CHUNK):
            if decompressor is None:
                if full(chunk):
                    return b"".join(parts)
                continue
            received += len(chunk)
            data = chunk
            while data:
                try:
                    out = decompressor.decompress(data, limit - size + 1)
                except zlib.error:
                    if encoding == "deflate" and not raw_deflate_tried and size == 0:
                        # Some servers send raw deflate without the zlib header.
                        raw_deflate_tried = True
                        decompressor = zlib.decompressobj(-zlib.MAX_WBITS)
                        continue
                    raise APIConnectionError(
                        f"the response body is not valid {encoding} data", retryable=True
                    ) from None
                if full(out):
                    return b"".join(parts)
                data = decompressor.unconsumed_tail
    except aiohttp.ClientPayloadError as exc:
        if isinstance(exc.__cause__, _SessionInflateLimitError):
            # A bomb that the caller's session stopped first: too large, not a broken connection.
            raise ResponseTooLargeError(
                f"the response body inflates past the session's own limit ({exc.__cause__})",
                limit=limit,
            ) from None
        raise
    if decompressor is not None:
        if full(decompressor.flush()):
            return b"".join(parts)
        if received and not decompressor.eof:
            # A stream cut before its end: its checksum was never read, so the data is suspect.
            raise APIConnectionError(
                f"the response body ended before its {encoding} data did", retryable=True
            )
    return b"".join(parts)


def _running_loop() -> asyncio.AbstractEventLoop:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        # Under trio (or with no event loop at all): say so instead of a bare RuntimeError.
        raise ConfigurationError(_ASYNCIO_ONLY) from None


def _unsupported_encoding(encoding: str) -> ResponseValidationError:
    return ResponseValidationError(
        f"the response uses an unsupported Content-Encoding {encoding!r}", path=None, body=b""
    )


@functools.lru_cache(maxsize=64)
def _client_timeout(timeout: Timeout) -> aiohttp.ClientTimeout:
    """aiohttp's timeout for ours, made once per ``Timeout`` (both are immutable)."""
    return aiohttp.ClientTimeout(
        total=timeout.total, sock_connect=timeout.connect, sock_read=timeout.read
    )


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
        scrubbed = info._replace(headers=CIMultiDictProxy(clean))
        exc.request_info = scrubbed  # type: ignore[attr-defined]
        # The constructor's arguments are kept in .args too (and pickled from there).
        exc.args = tuple(scrubbed if arg is info else arg for arg in exc.args)
    if hasattr(exc, "history"):
        exc.history = ()


def scrub_headers(headers: Mapping[str, str], secret: str) -> Mapping[str, str]:
    """Response headers as received, unless the server echoed the key: then with it replaced.

    ``Transport.send`` returns the headers as received; the client calls this wherever they
    leave it (``APIResponse.headers``, the errors it raises).
    """
    if not secret:
        return headers
    # One search in the joined values instead of one per value; NUL cannot be part of a key
    # (the client refuses it), so no match can straddle two values.
    if secret not in "\x00".join(headers.values()):
        return headers
    return CIMultiDictProxy(CIMultiDict((k, redact(v, secret)) for k, v in headers.items()))


def _translate(exc: Exception, secret: str) -> AsyncSearchError:
    """Map an aiohttp or OS error to the asyncsearch error a caller can act on."""
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
    if isinstance(exc, aiohttp.ClientSSLError):
        return APIConnectionError(
            f"TLS failed: {detail}",
            request_sent=not isinstance(exc, aiohttp.ClientConnectorError),
        )
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
