"""``AsyncSearchClient``: options, retries with backoff, and one method per endpoint."""

from __future__ import annotations

import logging
import os
import random
import ssl as ssl_module
import time
import uuid
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar
from urllib.parse import urlsplit

import aiohttp
import anyio

from . import _protocol as protocol
from ._concurrency import RetryBudget
from ._config import (
    DEFAULT_MAX_REDIRECTS,
    DEFAULT_MAX_RESPONSE_BYTES,
    DEFAULT_MAX_RETRY_AFTER,
    NOT_GIVEN,
    NotGiven,
    Timeout,
)
from ._errors import (
    APIConnectionError,
    APITimeoutError,
    AsyncSearchError,
    ClientClosedError,
    ConfigurationError,
    ResponseValidationError,
)
from ._models import (
    ExtractionJob,
    LinkPreview,
    SearchFilters,
    SearchPage,
    SearchQuery,
    Sort,
    WebhookLog,
    WebhookLogSummary,
)
from ._protocol import Request, Response
from ._transport import USER_AGENT, Transport

__all__ = ["APIResponse", "AsyncSearchClient"]

T = TypeVar("T")
P = ParamSpec("P")

logger = logging.getLogger("asyncsearch")

ENV_API_KEY = "ASYNCSEARCH_API_KEY"
ENV_BASE_URL = "ASYNCSEARCH_BASE_URL"
BACKOFF_BASE = 0.5
BACKOFF_CAP = 8.0
# Looked up at call time, so tests can record backoff delays instead of sleeping them.
_sleep = anyio.sleep


class _Secret:
    """Holds the API key so that no repr, log or traceback of the client shows it."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def get(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "<secret>"


@dataclass(frozen=True, slots=True)
class _Options:
    """Everything a client decides per request; ``with_options`` makes a changed copy."""

    api_key: _Secret
    base_url: str
    base_id: str | None
    timeout: Timeout
    max_retries: int
    headers: Mapping[str, str]
    ssl: ssl_module.SSLContext | None
    max_response_bytes: int
    allow_http: bool
    max_retry_after: float
    max_redirects: int
    first_page: int


class _Shared:
    """What a client and the clients made by ``with_options`` share: the pool and the budget."""

    def __init__(self, transport: Transport, retry_budget: RetryBudget | None) -> None:
        self.transport = transport
        self.retry_budget = retry_budget
        self.random = random.Random()


class APIResponse(Generic[T]):
    """A success response with its metadata; ``parse()`` gives the typed model.

    ``status_code``, ``headers`` (case-insensitive), ``elapsed`` (seconds of the last attempt),
    ``attempts`` (how many were made), ``url`` and ``content`` (the raw body).
    """

    __slots__ = ("_parsed", "_request", "_response", "attempts")

    def __init__(self, request: Request[T], response: Response, attempts: int) -> None:
        self._request = request
        self._response = response
        self._parsed: tuple[T] | None = None
        self.attempts = attempts

    @property
    def status_code(self) -> int:
        return self._response.status

    @property
    def headers(self) -> Mapping[str, str]:
        return self._response.headers

    @property
    def elapsed(self) -> float:
        return self._response.elapsed

    @property
    def url(self) -> str:
        return self._response.url

    @property
    def content(self) -> bytes:
        return self._response.body

    def parse(self) -> T:
        """Decode the body (once; later calls return the same object).

        Raises ``ResponseValidationError`` when the body does not fit the model.
        """
        if self._parsed is None:
            try:
                self._parsed = (self._request.parse(self._response.body),)
            except ResponseValidationError as exc:
                exc.attempts = self.attempts
                raise
        return self._parsed[0]

    def __repr__(self) -> str:
        return (
            f"<APIResponse [{self.status_code}] {self._request.method} "
            f"{urlsplit(self.url).path} attempts={self.attempts}>"
        )


def _check_text_option(name: str, value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigurationError(f"{name} must be a non-empty string")
    if any(c in value for c in "\r\n\x00"):
        raise ConfigurationError(f"{name} must not contain line breaks or NUL characters")
    return value


def _check_headers(headers: Mapping[str, str] | None) -> Mapping[str, str]:
    if headers is None:
        return {}
    if not isinstance(headers, Mapping):
        raise ConfigurationError("headers must be a mapping of header names to values")
    for key, value in headers.items():
        _check_text_option(f"header name {key!r}", key)
        if not isinstance(value, str) or any(c in value for c in "\r\n\x00"):
            raise ConfigurationError(f"header {key!r} must be a string without line breaks")
    return dict(headers)


def _check_number(name: str, value: object, *, minimum: float, integer: bool = False) -> Any:
    kinds: tuple[type, ...] = (int,) if integer else (int, float)
    if (
        isinstance(value, bool) or not isinstance(value, kinds) or not float(value) >= minimum  # type: ignore[arg-type]
    ):
        kind = "an integer" if integer else "a number"
        raise ConfigurationError(f"{name} must be {kind} >= {minimum}, got {value!r}")
    return value


def _raw(
    build: Callable[P, Request[T]],
) -> Callable[Concatenate[_RawResponses, P], Coroutine[Any, Any, APIResponse[T]]]:
    async def call(self: _RawResponses, /, *args: P.args, **kwargs: P.kwargs) -> APIResponse[T]:
        return await self._client._send(build(*args, **kwargs))

    call.__name__ = build.__name__
    call.__doc__ = f"Like ``AsyncSearchClient.{build.__name__}``, returning an ``APIResponse``."
    return call


class _RawResponses:
    """The client's endpoints returning ``APIResponse`` (status, headers, attempts) instead."""

    def __init__(self, client: AsyncSearchClient) -> None:
        self._client = client

    search = _raw(protocol.search)
    get_extraction = _raw(protocol.get_extraction)
    link_preview = _raw(protocol.link_preview)
    list_webhook_logs = _raw(protocol.list_webhook_logs)
    get_webhook_log = _raw(protocol.get_webhook_log)


class AsyncSearchClient:
    """An async client of the content search and extraction service.

    Use it as ``async with AsyncSearchClient(...) as client:`` (or call ``await client.aclose()``).
    One client holds one connection pool; make it once and share it across tasks.

    Parameters:
        api_key: sent as ``X-Api-Key``; defaults to env ``ASYNCSEARCH_API_KEY``.
        base_url: the service's URL, may carry a path prefix; env ``ASYNCSEARCH_BASE_URL``.
        base_id: sends ``X-Service-Base-Id`` to run against that base.
        timeout: seconds per attempt, or ``Timeout(connect=, read=, total=)``.
        max_retries: retries after the first attempt (connection errors, timeouts, 408, 429, 5xx).
        max_connections: size of the connection pool (ignored when ``session`` is given).
        session: an ``aiohttp.ClientSession`` to use; the client never closes it.
        headers: extra headers on every request (they cannot replace the key or base id).
        ssl: an ``ssl.SSLContext``, e.g. to trust a private CA.
        trust_env: take proxies and netrc from the environment, as aiohttp does.
        max_response_bytes: cap on a decoded body; past it ``ResponseTooLargeError``.
        allow_http: allow a plain ``http://`` base URL to a host that is not loopback.
        max_retry_after: a ``Retry-After`` longer than this is not slept on; the error is raised.
        max_redirects: how many same-origin redirects one attempt follows.
        retry_budget: a ``RetryBudget`` shared with ``with_options`` clients; ``None`` disables.
        first_page: the number of the first page, used by the page iterators.

    Raises ``ConfigurationError`` for a missing key or URL and for invalid options.
    """

    def __init__(
        self,
        api_key: str | None = None,
        *,
        base_url: str | None = None,
        base_id: str | None = None,
        timeout: Timeout | float | None = None,
        max_retries: int = 2,
        max_connections: int = 100,
        session: aiohttp.ClientSession | None = None,
        headers: Mapping[str, str] | None = None,
        ssl: ssl_module.SSLContext | None = None,
        trust_env: bool = False,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        allow_http: bool = False,
        max_retry_after: float = DEFAULT_MAX_RETRY_AFTER,
        max_redirects: int = DEFAULT_MAX_REDIRECTS,
        retry_budget: RetryBudget | NotGiven | None = NOT_GIVEN,
        first_page: int = 1,
    ) -> None:
        if api_key is None:
            api_key = os.environ.get(ENV_API_KEY)
            if not api_key:
                raise ConfigurationError(f"api_key is missing: pass api_key= or set {ENV_API_KEY}")
        if base_url is None:
            base_url = os.environ.get(ENV_BASE_URL)
        _check_number("max_connections", max_connections, minimum=1, integer=True)
        if session is not None and not isinstance(session, aiohttp.ClientSession):
            raise ConfigurationError("session must be an aiohttp.ClientSession")
        if not isinstance(trust_env, bool):
            raise ConfigurationError("trust_env must be a bool")
        if not isinstance(retry_budget, RetryBudget | NotGiven | None):
            raise ConfigurationError("retry_budget must be an asyncsearch.RetryBudget or None")
        self._options = self._make_options(
            api_key=api_key,
            base_url=base_url,
            base_id=base_id,
            timeout=timeout,
            max_retries=max_retries,
            headers=headers,
            ssl=ssl,
            max_response_bytes=max_response_bytes,
            allow_http=allow_http,
            max_retry_after=max_retry_after,
            max_redirects=max_redirects,
            first_page=first_page,
        )
        transport = Transport(session=session, max_connections=max_connections, trust_env=trust_env)
        budget = RetryBudget() if isinstance(retry_budget, NotGiven) else retry_budget
        self._shared = _Shared(transport, budget)
        self._owns_transport = True
        self._closed = False

    @staticmethod
    def _make_options(
        *,
        api_key: str | _Secret,
        base_url: object,
        base_id: object,
        timeout: Timeout | float | None,
        max_retries: object,
        headers: Mapping[str, str] | None,
        ssl: object,
        max_response_bytes: object,
        allow_http: object,
        max_retry_after: object,
        max_redirects: object,
        first_page: object,
    ) -> _Options:
        if not isinstance(allow_http, bool):
            raise ConfigurationError("allow_http must be a bool")
        if ssl is not None and not isinstance(ssl, ssl_module.SSLContext):
            raise ConfigurationError("ssl must be an ssl.SSLContext or None")
        if base_id is not None:
            base_id = _check_text_option("base_id", base_id)
        if isinstance(first_page, bool) or not isinstance(first_page, int):
            raise ConfigurationError(f"first_page must be an integer, got {first_page!r}")
        secret = (
            api_key
            if isinstance(api_key, _Secret)
            else _Secret(_check_text_option("api_key", api_key))
        )
        return _Options(
            api_key=secret,
            base_url=protocol.check_base_url(base_url, allow_http=allow_http),
            base_id=base_id,
            timeout=Timeout.coerce(timeout),
            max_retries=_check_number("max_retries", max_retries, minimum=0, integer=True),
            headers=_check_headers(headers),
            ssl=ssl,
            max_response_bytes=_check_number(
                "max_response_bytes", max_response_bytes, minimum=1, integer=True
            ),
            allow_http=allow_http,
            max_retry_after=float(_check_number("max_retry_after", max_retry_after, minimum=0)),
            max_redirects=_check_number("max_redirects", max_redirects, minimum=0, integer=True),
            first_page=first_page,
        )

    # -- lifecycle ---------------------------------------------------------------------------

    async def __aenter__(self) -> AsyncSearchClient:
        self._check_open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the client. The pool closes with the client that made it, not with its copies.

        Calling it twice is fine; using the client afterwards raises ``ClientClosedError``.
        """
        self._closed = True
        if self._owns_transport:
            await self._shared.transport.aclose()

    @property
    def is_closed(self) -> bool:
        """True once this client, or the client whose pool it shares, was closed."""
        return self._closed or self._shared.transport.closed

    def _check_open(self) -> None:
        if self.is_closed:
            raise ClientClosedError("the client is closed")

    def with_options(
        self,
        *,
        api_key: str | NotGiven = NOT_GIVEN,
        base_url: str | NotGiven = NOT_GIVEN,
        base_id: str | NotGiven | None = NOT_GIVEN,
        timeout: Timeout | float | NotGiven | None = NOT_GIVEN,
        max_retries: int | NotGiven = NOT_GIVEN,
        headers: Mapping[str, str] | NotGiven | None = NOT_GIVEN,
        ssl: ssl_module.SSLContext | NotGiven | None = NOT_GIVEN,
        max_response_bytes: int | NotGiven = NOT_GIVEN,
        allow_http: bool | NotGiven = NOT_GIVEN,
        max_retry_after: float | NotGiven = NOT_GIVEN,
        max_redirects: int | NotGiven = NOT_GIVEN,
        first_page: int | NotGiven = NOT_GIVEN,
    ) -> AsyncSearchClient:
        """A client with some options changed that shares this one's pool and retry budget.

        ``base_id=None`` clears the base; an option not given keeps its value. Closing the
        returned client does not close the shared pool.
        """
        self._check_open()
        old = self._options
        given: dict[str, Any] = {
            k: v
            for k, v in {
                "api_key": api_key,
                "base_url": base_url,
                "base_id": base_id,
                "timeout": timeout,
                "max_retries": max_retries,
                "headers": headers,
                "ssl": ssl,
                "max_response_bytes": max_response_bytes,
                "allow_http": allow_http,
                "max_retry_after": max_retry_after,
                "max_redirects": max_redirects,
                "first_page": first_page,
            }.items()
            if not isinstance(v, NotGiven)
        }
        current: dict[str, Any] = {
            "api_key": old.api_key,
            "base_url": old.base_url,
            "base_id": old.base_id,
            "timeout": old.timeout,
            "max_retries": old.max_retries,
            "headers": old.headers,
            "ssl": old.ssl,
            "max_response_bytes": old.max_response_bytes,
            "allow_http": old.allow_http,
            "max_retry_after": old.max_retry_after,
            "max_redirects": old.max_redirects,
            "first_page": old.first_page,
        }
        current.update(given)
        child = object.__new__(AsyncSearchClient)
        child._options = self._make_options(**current)
        child._shared = self._shared
        child._owns_transport = False
        child._closed = False
        return child

    def __repr__(self) -> str:
        opts = self._options
        state = "closed" if self.is_closed else "open"
        return (
            f"<AsyncSearchClient base_url={opts.base_url!r} base_id={opts.base_id!r} "
            f"max_retries={opts.max_retries} {state}>"
        )

    # -- the request loop --------------------------------------------------------------------

    async def _send(self, request: Request[T]) -> APIResponse[T]:
        """Send a request with retries; return the success response or raise its error."""
        self._check_open()
        opts = self._options
        shared = self._shared
        secret = opts.api_key.get()
        url = opts.base_url + request.target
        path = urlsplit(url).path
        headers = protocol.build_headers(
            api_key=secret,
            base_id=opts.base_id,
            user_agent=USER_AGENT,
            extra=opts.headers,
            has_body=request.body is not None,
        )
        attempts = 0
        while True:
            attempts += 1
            started = time.monotonic()
            try:
                response = await shared.transport.send(
                    request.method,
                    url,
                    headers=headers,
                    body=request.body,
                    timeout=opts.timeout,
                    max_response_bytes=opts.max_response_bytes,
                    max_redirects=opts.max_redirects,
                    ssl=opts.ssl,
                    secret=secret,
                )
            except APIConnectionError as exc:
                exc.attempts = attempts
                logger.debug(
                    "%s %s -> %s (attempt %d, %.3fs)",
                    request.method,
                    path,
                    type(exc).__name__,
                    attempts,
                    time.monotonic() - started,
                )
                timed_out = isinstance(exc, APITimeoutError)
                if not exc.retryable or not self._may_retry(attempts, after_timeout=timed_out):
                    raise
                delay = self._backoff(attempts)
                self._log_retry(request, path, attempts, delay, type(exc).__name__)
                await _sleep(delay)
                continue
            except AsyncSearchError as exc:
                exc.attempts = attempts
                raise

            status = response.status
            logger.debug(
                "%s %s -> %d (attempt %d, %.3fs)",
                request.method,
                path,
                status,
                attempts,
                response.elapsed,
            )
            if 200 <= status < 300:
                if shared.retry_budget is not None:
                    shared.retry_budget.on_success()
                return APIResponse(request, response, attempts)

            retry_after = protocol.parse_retry_after(response.headers)
            error = protocol.status_error(
                response,
                method=request.method,
                attempts=attempts,
                secret=secret,
                retry_after=retry_after,
                reason=_redirect_reason(response),
            )
            if not protocol.is_retryable_status(status):
                raise error
            if retry_after is not None and retry_after > opts.max_retry_after:
                logger.info(
                    "%s %s: the server asked to wait %.1fs, more than max_retry_after=%.1fs; "
                    "not retrying",
                    request.method,
                    path,
                    retry_after,
                    opts.max_retry_after,
                )
                raise error
            if not self._may_retry(attempts, after_timeout=False):
                raise error
            delay = retry_after if retry_after is not None else self._backoff(attempts)
            self._log_retry(request, path, attempts, delay, f"status {status}")
            await _sleep(delay)

    def _may_retry(self, attempts: int, *, after_timeout: bool) -> bool:
        if attempts > self._options.max_retries:
            return False
        budget = self._shared.retry_budget
        if budget is not None and not budget.try_acquire(after_timeout=after_timeout):
            logger.debug("retry budget exhausted (%s tokens left); not retrying", budget.tokens)
            return False
        return True

    def _backoff(self, attempts: int) -> float:
        return protocol.backoff_delay(
            attempts, base=BACKOFF_BASE, cap=BACKOFF_CAP, random=self._shared.random.random
        )

    def _log_retry(
        self, request: Request[Any], path: str, attempts: int, delay: float, reason: str
    ) -> None:
        logger.info(
            "retrying %s %s in %.2fs (attempt %d of %d failed: %s)",
            request.method,
            path,
            delay,
            attempts,
            self._options.max_retries + 1,
            reason,
        )

    # -- endpoints ---------------------------------------------------------------------------

    @property
    def with_raw_response(self) -> _RawResponses:
        """The same endpoints, returning ``APIResponse`` with status, headers and attempts."""
        return _RawResponses(self)

    async def search(
        self,
        text: str | None = None,
        *,
        image: str | None = None,
        resource_id: str | uuid.UUID | None = None,
        filters: SearchFilters | Mapping[str, Any] | None = None,
        precision: float | None = None,
        queries: Sequence[SearchQuery | Mapping[str, Any]] | None = None,
        incognito: bool | None = None,
        page: int | None = None,
        page_size: int | None = None,
        sort: Sort | Mapping[str, Any] | None = None,
    ) -> SearchPage:
        """Search resources by text, image (a data URL) or similarity to a resource.

        ``filters`` and ``sort`` take the Struct or a dict with the same keys; arguments left as
        ``None`` are not sent. Raises ``InvalidRequestError`` before sending when an argument is
        past the spec's limits (text over 255 characters, precision outside [0, 1], ...).
        """
        request = protocol.search(
            text,
            image=image,
            resource_id=resource_id,
            filters=filters,
            precision=precision,
            queries=queries,
            incognito=incognito,
            page=page,
            page_size=page_size,
            sort=sort,
        )
        return (await self._send(request)).parse()

    async def get_extraction(
        self, job_id: str | uuid.UUID, *, format: str | None = None
    ) -> ExtractionJob:
        """The result of an extraction job; ``format`` is "json" or "markdown".

        Raises ``NotFoundError`` when the job does not exist.
        """
        return (await self._send(protocol.get_extraction(job_id, format=format))).parse()

    async def link_preview(self, url: str, *, type: str | None = None) -> LinkPreview:
        """Open-graph data of a URL; ``type`` is "cache" or "link"."""
        return (await self._send(protocol.link_preview(url, type=type))).parse()

    async def list_webhook_logs(self, job_id: str | uuid.UUID) -> list[WebhookLogSummary]:
        """The webhook delivery attempts of an extraction job, in summary form."""
        return (await self._send(protocol.list_webhook_logs(job_id))).parse()

    async def get_webhook_log(self, job_id: str | uuid.UUID, log_id: str | uuid.UUID) -> WebhookLog:
        """One webhook delivery attempt with its request payload and response body."""
        return (await self._send(protocol.get_webhook_log(job_id, log_id))).parse()


def _redirect_reason(response: Response) -> str | None:
    if 300 <= response.status < 400:
        location = response.headers.get("Location")
        if location is None:
            return "a redirect without a Location header"
        return (
            "a redirect to another origin was not followed: only same-origin redirects are "
            "followed, so the API key is never sent anywhere else"
        )
    return None
