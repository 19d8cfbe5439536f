"""The one place that touches aiohttp: owns the session, sends one attempt, maps every error.

One attempt means: send the request, follow same-origin redirects (never carrying the key
anywhere else), read the whole body under ``max_response_bytes`` (decompressing it here, in
bounded steps, so a gzip bomb cannot blow up memory), and hand back a ``Response`` value. Every
aiohttp and OS error becomes an asyncsearch error in ``_translate``, with any request headers
scrubbed from what it carries.
"""

from __future__ import annotations

import asyncio
import ssl as ssl_module
import sys
import time
import zlib
from collections.abc import Mapping

import aiohttp
import yarl
from multidict import CIMultiDict, CIMultiDictProxy

from ._config import Timeout
from ._errors import (
    APIConnectionError,
    APITimeoutError,
    AsyncSearchError,
    ClientClosedError,
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
        self._session = session
        self._owns_session = session is None
        self._max_connections = max_connections
        self._trust_env = trust_env
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    @property
    def closed(self) -> bool:
        """True once ``aclose`` was called (or a passed-in session was closed)."""
        return self._closed or (self._session is not None and self._session.closed)

    def _get_session(self) -> aiohttp.ClientSession:
        if self._closed:
            raise ClientClosedError("the client is closed")
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        elif loop is not self._loop:
            raise ClientClosedError(
                "the client is used from another event loop than the one it was first used in; "
                "create one client per event loop"
            )
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=self._max_connections)
            self._session = aiohttp.ClientSession(
                connector=connector,
                trust_env=self._trust_env,
                # Decompression happens in _read_body, in bounded steps.
                auto_decompress=False,
            )
            # aiohttp quietly resends an idempotent request once when the server drops the
            # connection. The client's own retry loop decides about retries (and counts them
            # against max_retries and the retry budget), so that hidden resend is turned off.
            if hasattr(self._session, "_retry_connection"):
                setattr(self._session, "_retry_connection", False)  # noqa: B010
        elif self._session.closed:
            raise ClientClosedError("the aiohttp session passed to the client is closed")
        return self._session

    async def aclose(self) -> None:
        """Close the session if this transport created it; further sends raise."""
        self._closed = True
        session, self._session = self._session, None
        if session is not None and self._owns_session and not session.closed:
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
        ``ResponseTooLargeError`` past the size cap, ``APIStatusError`` for a redirect loop,
        and ``ClientClosedError`` when the client is (or gets) closed.
        """
        session = self._get_session()
        decompress_here = not session.auto_decompress
        client_timeout = aiohttp.ClientTimeout(
            total=timeout.total, sock_connect=timeout.connect, sock_read=timeout.read
        )
        started = time.monotonic()
        current_url, current_method, current_body = url, method, body
        last_status = 0
        try:
            for _ in range(max_redirects + 1):
                async with session.request(
                    current_method,
                    yarl.URL(current_url, encoded=True),
                    headers=headers,
                    data=current_body,
                    timeout=client_timeout,
                    allow_redirects=False,
                    ssl=ssl if ssl is not None else True,
                ) as resp:
                    location = resp.headers.get("Location")
                    if resp.status in _REDIRECTS and location is not None:
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
                        content = await _read_body(resp, max_response_bytes, decompress_here)
                    else:
                        # An error body only feeds the error's message: a huge one (a proxy's
                        # HTML page) is cut, so the status still decides, and a 5xx is retried.
                        content = await _read_body(
                            resp,
                            min(max_response_bytes, _ERROR_BODY_LIMIT),
                            decompress_here,
                            cut=True,
                        )
                    return Response(
                        status=resp.status,
                        headers=_scrub_headers(resp.headers, secret),
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


async def _read_body(
    resp: aiohttp.ClientResponse, limit: int, decompress_here: bool, *, cut: bool = False
) -> bytes:
    """Read the whole body, decompressed in bounded steps, refusing more than ``limit`` bytes.

    With ``cut`` a longer body is not an error: its first ``limit`` bytes are returned.
    """
    encoding = resp.headers.get("Content-Encoding", "").strip().lower() if decompress_here else ""
    if encoding in ("", "identity"):
        decompressor = None
        declared = resp.content_length
        sent_encoding = resp.headers.get("Content-Encoding", "identity").strip().lower()
        if declared is not None and declared <= limit and sent_encoding == "identity":
            # aiohttp ends the payload at Content-Length, so this one read is bounded too (not
            # so when a caller's session inflates the body: that goes through the loop below).
            return await resp.read()
        if declared is not None and not cut:
            raise _too_large(limit)
    elif encoding in ("gzip", "x-gzip", "deflate"):
        # 32 + MAX_WBITS accepts both gzip and zlib headers; raw deflate is retried below.
        decompressor = zlib.decompressobj(32 + zlib.MAX_WBITS)
    else:
        raise ResponseValidationError(
            f"the response uses an unsupported Content-Encoding {encoding!r}",
            path=None,
            body=b"",
        )
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
    if decompressor is not None:
        if full(decompressor.flush()):
            return b"".join(parts)
        if received and not decompressor.eof:
            # A stream cut before its end: its checksum was never read, so the data is suspect.
            raise APIConnectionError(
                f"the response body ended before its {encoding} data did", retryable=True
            )
    return b"".join(parts)


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


def _scrub_headers(headers: CIMultiDictProxy[str], secret: str) -> CIMultiDictProxy[str]:
    """Response headers as received, unless the server echoed the key: then with it replaced."""
    if not any(secret in value for value in headers.values()):
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
