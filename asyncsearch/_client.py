"""``AsyncSearchClient``: options, retries with backoff, and one method per endpoint."""

from __future__ import annotations

import contextlib
import logging
import os
import random
import ssl as ssl_module
import time
import uuid
from collections.abc import (
    AsyncIterable,
    Callable,
    Collection,
    Iterable,
    Mapping,
)
from dataclasses import dataclass, field
from operator import attrgetter
from types import TracebackType
from typing import (
    TYPE_CHECKING,
    Any,
    Generic,
    Literal,
    Self,
    TypeAlias,
    TypedDict,
    TypeVar,
    Unpack,
    cast,
    overload,
)
from urllib.parse import urlsplit

import anyio
import msgspec

from . import _protocol as protocol
from ._checks import check_int
from ._concurrency import (
    AdaptiveConcurrency,
    AsyncClosing,
    FanOut,
    Outcome,
    Pager,
    RetryBudget,
    limited_fan_out,
)
from ._config import (
    DEFAULT_MAX_REDIRECTS,
    DEFAULT_MAX_RESPONSE_BYTES,
    DEFAULT_MAX_RETRY_AFTER,
    NOT_GIVEN,
    NotGiven,
    RequestOptions,
    SearchOptions,
    Timeout,
)
from ._errors import (
    APIConnectionError,
    APIStatusError,
    APITimeoutError,
    AsyncSearchError,
    AuthenticationError,
    ClientClosedError,
    ConfigurationError,
    InvalidRequestError,
    PermissionDeniedError,
    ResponseValidationError,
    WaitTimeoutError,
)
from ._models import (
    IN_PROGRESS_JOB_STATES,
    ExtractionFormat,
    ExtractionJob,
    LinkPreview,
    LinkType,
    SearchHit,
    SearchHitId,
    SearchPage,
    SearchPageHead,
    WebhookLog,
    WebhookLogSummary,
)
from ._protocol import Request, Response, SearchParams, SearchWalkParams
from ._tracing import ENV_TRACE_CONTENT, NO_SPAN, CallSpan, LazySpan, Tracing
from ._transport import USER_AGENT, Transport, scrub_headers

if TYPE_CHECKING:
    import aiohttp  # only for annotations: _transport.py is the one module that uses aiohttp

__all__ = [
    "APIResponse",
    "AsyncSearchClient",
    "ExtractionFailure",
    "ExtractionResult",
    "ExtractionResults",
    "ExtractionSuccess",
    "OptionChanges",
    "RawResponseClient",
    "SearchCallParams",
    "SearchPager",
    "SearchWalkCallParams",
]

T = TypeVar("T")
Y = TypeVar("Y")
if TYPE_CHECKING:
    # A default (PEP 696) for checkers only: a bare ``ExtractionResult`` means either kind of id.
    from typing_extensions import TypeVar as TypeVarWithDefault

    #: The type of the ids given to a bulk call: each result carries its id back as given.
    JobId = TypeVarWithDefault(
        "JobId", bound=str | uuid.UUID, default=str | uuid.UUID, covariant=True
    )
else:
    JobId = TypeVar("JobId", bound=str | uuid.UUID, covariant=True)
#: The same, for the functions that take the ids.
Id = TypeVar("Id", bound=str | uuid.UUID)

logger = logging.getLogger("asyncsearch")

ENV_API_KEY = "ASYNCSEARCH_API_KEY"
ENV_BASE_URL = "ASYNCSEARCH_BASE_URL"
BACKOFF_BASE = 0.5
BACKOFF_CAP = 8.0
WAIT_INTERVAL_CAP = 10.0
#: The ``retry_search`` option: see ``AsyncSearchClient``.
SearchRetryPolicy: TypeAlias = Literal["safe", "always"]
_SEARCH_RETRY_POLICIES = ("safe", "always")
# Looked up at call time, so tests can record backoff delays instead of sleeping them.
_sleep = anyio.sleep
#: ``ASYNCSEARCH_LOG=debug`` (or ``info``, ``warning``, ``error``, ``critical``: the standard
#: level names, in any case): a quick look at what the client does, on stderr.
ENV_LOG = "ASYNCSEARCH_LOG"


def _setup_logging() -> None:
    """Give the ``asyncsearch`` logger a stderr handler and a level when ``ASYNCSEARCH_LOG`` asks.

    Nothing is changed when the variable is not set, or when the logger already has a handler
    (the application configured it).
    """
    value = os.environ.get(ENV_LOG, "").strip()
    if not value:
        return
    names = logging.getLevelNamesMapping()
    level = names.get(value.upper())
    if level is None or level == logging.NOTSET:
        choices = ", ".join(sorted(name.lower() for name in names if name != "NOTSET"))
        logging.getLogger("asyncsearch").warning(
            "%s=%r is not a level name (%s); asyncsearch's logging is left as it is",
            ENV_LOG,
            value,
            choices,
        )
        return
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(
            logging.Formatter("[%(asctime)s - %(name)s:%(lineno)d - %(levelname)s] %(message)s")
        )
        logger.addHandler(handler)
    logger.setLevel(level)


_setup_logging()


class SearchCallParams(SearchParams, SearchOptions, total=False):
    """The keyword arguments of ``search``: ``SearchParams`` and the call's ``SearchOptions``."""


class SearchWalkCallParams(SearchWalkParams, SearchOptions, total=False):
    """The keyword arguments of ``search_pages``/``search_hits`` after their own ones."""


class OptionChanges(TypedDict, total=False):
    """The keywords of ``with_options``: the options of ``AsyncSearchClient`` but the pool's.

    (``max_connections``, ``session``, ``trust_env`` and ``retry_budget`` belong to the pool,
    which the clients made by ``with_options`` share.)
    """

    api_key: str
    base_url: str
    base_id: str | None
    timeout: Timeout | float | None
    max_retries: int
    headers: Mapping[str, str | None] | None
    ssl: ssl_module.SSLContext | None
    max_response_bytes: int
    allow_http: bool
    max_retry_after: float
    max_redirects: int
    first_page: int
    retry_search: SearchRetryPolicy
    tracing: bool
    trace_content: bool | None


_OPTION_NAMES = OptionChanges.__optional_keys__
_REQUEST_OPTIONS = RequestOptions.__optional_keys__
_SEARCH_OPTIONS = SearchOptions.__optional_keys__


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
    retry_search: SearchRetryPolicy
    tracing: bool
    trace_content: bool | None
    # Derived once per client instead of once per request.
    headers_without_body: Mapping[str, str] = field(init=False, repr=False)
    headers_with_body: Mapping[str, str] = field(init=False, repr=False)
    tracer: Tracing = field(init=False, repr=False)

    def __post_init__(self) -> None:
        without, with_body = self.headers_for(self.headers)
        object.__setattr__(self, "headers_without_body", without)
        object.__setattr__(self, "headers_with_body", with_body)
        content = self.trace_content
        if content is None:
            content = os.environ.get(ENV_TRACE_CONTENT, "").strip().lower() in ("1", "true", "yes")
        tracer = Tracing(base_url=self.base_url, enabled=self.tracing, content=content)
        object.__setattr__(self, "tracer", tracer)

    def headers_for(self, extra: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
        """The headers of a request without a body and of one with, ``extra`` added."""
        return tuple(  # type: ignore[return-value]
            protocol.build_headers(
                api_key=self.api_key.get(),
                base_id=self.base_id,
                user_agent=USER_AGENT,
                extra=extra,
                has_body=has_body,
            )
            for has_body in (False, True)
        )


@dataclass(frozen=True, slots=True)
class _Call:
    """One call's ``RequestOptions``, checked, with the client's options filled in."""

    timeout: Timeout
    max_retries: int
    headers_without_body: Mapping[str, str]
    headers_with_body: Mapping[str, str]
    query: tuple[tuple[str, str], ...]
    body: dict[str, Any] | None

    def apply(self, request: Request[T]) -> Request[T]:
        """The request with this call's ``extra_query`` and ``extra_body``."""
        if self.query or self.body:
            return protocol.with_extras(request, query=self.query, body=self.body)
        return request


def _call_options(
    opts: _Options, options: Mapping[str, Any], function: str, *, search: bool = False
) -> _Call | None:
    """Check one call's options (``RequestOptions``); None when none were given."""
    if not options:
        return None
    for name in options:
        if name not in (_SEARCH_OPTIONS if search else _REQUEST_OPTIONS):
            raise TypeError(f"{function}() got an unexpected keyword argument {name!r}")
    timeout = opts.timeout
    if "timeout" in options:
        try:
            timeout = Timeout.coerce(options["timeout"])
        except ConfigurationError as exc:
            raise InvalidRequestError(exc.message) from None
    max_retries = options.get("max_retries", opts.max_retries)
    if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
        raise InvalidRequestError(f"max_retries must be an integer >= 0, got {max_retries!r}")
    without, with_body = opts.headers_without_body, opts.headers_with_body
    if "extra_headers" in options:
        extra = protocol.check_extra_headers(
            options["extra_headers"], name="extra_headers", error=InvalidRequestError
        )
        without, with_body = opts.headers_for({**opts.headers, **extra})
    query = protocol.encode_extra_query(options["extra_query"]) if "extra_query" in options else ()
    body = protocol.check_extra_body(options["extra_body"]) if "extra_body" in options else None
    return _Call(timeout, max_retries, without, with_body, query, body)


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

    __slots__ = ("_parsed", "_request", "_response", "_secret", "attempts")
    # Made by the client only (_api_response): no constructor of its own in help().
    _request: Request[T]
    _response: Response
    _parsed: tuple[T] | None
    _secret: str
    attempts: int

    @property
    def status_code(self) -> int:
        return self._response.status

    @property
    def headers(self) -> Mapping[str, str]:
        # Scrubbed here, where they leave the client, not for every answer of a bulk fetch.
        return scrub_headers(self._response.headers, self._secret)

    @property
    def elapsed(self) -> float:
        return self._response.elapsed

    @property
    def url(self) -> str:
        return self._response.url

    @property
    def content(self) -> bytes:
        return self._response.body

    @property
    def request_id(self) -> str | None:
        """The id the service gave this answer (``X-Request-Id`` or ``Request-Id``), if any."""
        return protocol.request_id(self.headers)

    def parse(self) -> T:
        """Decode the body (once; later calls return the same object).

        Raises ``ResponseValidationError`` when the body does not fit the model.
        """
        if self._parsed is None:
            try:
                self._parsed = (self._request.parse(self._response.body),)
            except ResponseValidationError as exc:
                exc.attempts = self.attempts
                exc.request_id = self.request_id
                if self._secret and self._secret.encode() in exc.body:
                    # A server (or a proxy's debug page) echoing the request's headers.
                    exc.body = exc.body.replace(self._secret.encode(), b"[redacted]")
                raise
        return self._parsed[0]

    def __repr__(self) -> str:
        return (
            f"<APIResponse [{self.status_code}] {self._request.method} "
            f"{urlsplit(self.url).path} attempts={self.attempts}>"
        )


def _api_response(
    request: Request[T], response: Response, attempts: int, secret: str
) -> APIResponse[T]:
    answer: APIResponse[T] = APIResponse.__new__(APIResponse)
    answer._request = request
    answer._response = response
    answer._parsed = None
    answer._secret = secret
    answer.attempts = attempts
    return answer


def _check_text_option(name: str, value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigurationError(f"{name} must be a non-empty string")
    if any(c in value for c in "\r\n\x00"):
        raise ConfigurationError(f"{name} must not contain line breaks or NUL characters")
    return value


def _check_headers(headers: Mapping[str, str] | None) -> Mapping[str, str]:
    if headers is None:
        return {}
    return protocol.check_extra_headers(headers, name="headers", error=ConfigurationError)


def _merge_headers(
    headers: Mapping[str, str], changes: Mapping[str, str | None]
) -> dict[str, str | None]:
    """``headers`` with ``changes`` over them, names compared in any case; None removes one."""
    if not isinstance(changes, Mapping):
        raise ConfigurationError("headers must be a mapping of header names to values, or None")
    replaced = {name.lower() for name in changes if isinstance(name, str)}
    merged: dict[str, str | None] = {
        name: value for name, value in headers.items() if name.lower() not in replaced
    }
    merged.update((name, value) for name, value in changes.items() if value is not None)
    return merged


def _check_number(name: str, value: object, *, minimum: float, integer: bool = False) -> Any:
    kinds: tuple[type, ...] = (int,) if integer else (int, float)
    if (
        isinstance(value, bool) or not isinstance(value, kinds) or not float(value) >= minimum  # type: ignore[arg-type]
    ):
        kind = "an integer" if integer else "a number"
        raise ConfigurationError(f"{name} must be {kind} >= {minimum}, got {value!r}")
    return value


def _make_options(values: Mapping[str, Any]) -> _Options:
    """Check the client's options (``OptionChanges``) and make the ``_Options`` of a client."""
    api_key, allow_http, tracing = values["api_key"], values["allow_http"], values["tracing"]
    ssl, base_id, first_page = values["ssl"], values["base_id"], values["first_page"]
    retry_search, trace_content = values["retry_search"], values["trace_content"]
    if not isinstance(allow_http, bool):
        raise ConfigurationError("allow_http must be a bool")
    if not isinstance(tracing, bool):
        raise ConfigurationError("tracing must be a bool")
    if trace_content is not None and not isinstance(trace_content, bool):
        raise ConfigurationError("trace_content must be a bool or None")
    if ssl is not None and not isinstance(ssl, ssl_module.SSLContext):
        raise ConfigurationError("ssl must be an ssl.SSLContext or None")
    if base_id is not None:
        base_id = _check_text_option("base_id", base_id)
    if isinstance(first_page, bool) or not isinstance(first_page, int):
        raise ConfigurationError(f"first_page must be an integer, got {first_page!r}")
    if retry_search not in _SEARCH_RETRY_POLICIES:
        raise ConfigurationError(f"retry_search must be 'safe' or 'always', got {retry_search!r}")
    if not isinstance(api_key, _Secret):
        api_key = _Secret(_check_text_option("api_key", api_key))
    return _Options(
        api_key=api_key,
        base_url=protocol.check_base_url(values["base_url"], allow_http=allow_http),
        base_id=base_id,
        timeout=Timeout.coerce(values["timeout"]),
        max_retries=_check_number("max_retries", values["max_retries"], minimum=0, integer=True),
        headers=_check_headers(values["headers"]),
        ssl=ssl,
        max_response_bytes=_check_number(
            "max_response_bytes", values["max_response_bytes"], minimum=1, integer=True
        ),
        allow_http=allow_http,
        max_retry_after=float(
            _check_number("max_retry_after", values["max_retry_after"], minimum=0)
        ),
        max_redirects=_check_number(
            "max_redirects", values["max_redirects"], minimum=0, integer=True
        ),
        first_page=first_page,
        retry_search=retry_search,
        tracing=tracing,
        trace_content=trace_content,
    )


class RawResponseClient:
    """The client's endpoints returning ``APIResponse`` (status, headers, attempts) instead.

    Reached as ``client.with_raw_response``; every method takes exactly the arguments of the
    client method of the same name, and ``APIResponse.parse()`` gives what that method returns.
    """

    __slots__ = ("_client",)

    def __init__(self, client: AsyncSearchClient) -> None:
        self._client = client

    async def search(
        self,
        text: str | None = None,
        *,
        embeddings: bool = True,
        **params: Unpack[SearchCallParams],
    ) -> APIResponse[SearchPage]:
        """Like ``AsyncSearchClient.search``, returning an ``APIResponse``."""
        response: APIResponse[SearchPage]
        response = await self._client._search(text, embeddings, params, parse=False)
        return response

    async def get_extraction(
        self,
        job_id: str | uuid.UUID,
        *,
        format: ExtractionFormat | None = None,
        **options: Unpack[RequestOptions],
    ) -> APIResponse[ExtractionJob]:
        """Like ``AsyncSearchClient.get_extraction``, returning an ``APIResponse``."""
        request = protocol.get_extraction(job_id, format=format)
        return await self._client._call("get_extraction", request, options, parse=False)

    async def link_preview(
        self, url: str, *, type: LinkType | None = None, **options: Unpack[RequestOptions]
    ) -> APIResponse[LinkPreview]:
        """Like ``AsyncSearchClient.link_preview``, returning an ``APIResponse``."""
        request = protocol.link_preview(url, type=type)
        return await self._client._call("link_preview", request, options, parse=False)

    async def list_webhook_logs(
        self, job_id: str | uuid.UUID, **options: Unpack[RequestOptions]
    ) -> APIResponse[list[WebhookLogSummary]]:
        """Like ``AsyncSearchClient.list_webhook_logs``, returning an ``APIResponse``."""
        request = protocol.list_webhook_logs(job_id)
        return await self._client._call("list_webhook_logs", request, options, parse=False)

    async def get_webhook_log(
        self, job_id: str | uuid.UUID, log_id: str | uuid.UUID, **options: Unpack[RequestOptions]
    ) -> APIResponse[WebhookLog]:
        """Like ``AsyncSearchClient.get_webhook_log``, returning an ``APIResponse``."""
        request = protocol.get_webhook_log(job_id, log_id)
        return await self._client._call("get_webhook_log", request, options, parse=False)

    def __repr__(self) -> str:
        return f"<RawResponseClient of {self._client!r}>"


class SearchPager(Pager[Y]):
    """An async iterator over search pages (``search_pages``) or hits (``search_hits``).

    Also an async context manager with ``aclose()``. ``next_page`` is the page to resume from
    with ``start_page=`` (``None`` once the walk is finished) and ``total`` the last total seen.
    Leaving it in any way (exhausted, ``aclose``, ``async with``, an exception, cancellation, a
    bare ``break``) cancels a pending prefetch and sends nothing more.
    """

    def __init__(self, *args: Any, span: LazySpan, **kwargs: Any) -> None:
        self._span = span
        super().__init__(*args, **kwargs)

    async def __anext__(self) -> Y:
        try:
            return await super().__anext__()
        except StopAsyncIteration:
            self._span.end()
            raise
        except BaseException as exc:
            if self._done:  # the walk ended with it
                self._span.end(exc)
            raise

    async def aclose(self) -> None:
        await super().aclose()
        self._span.end()

    def __del__(self) -> None:
        super().__del__()
        span = getattr(self, "_span", None)
        if span is not None:
            span.end()


class ExtractionSuccess(msgspec.Struct, Generic[JobId], frozen=True, gc=False):
    """A job fetched by a bulk call: ``job_id`` exactly as given, and its ``job``.

    A frozen msgspec Struct, not tracked by the cyclic GC (it holds an id and an acyclic job):
    ``gather_extractions`` keeps one per id until it returns, and a tracked object per id cost
    ~5 µs per id in collections.
    """

    job_id: JobId
    job: ExtractionJob

    @property
    def error(self) -> None:
        """Always None: the job was fetched."""
        return None

    @property
    def ok(self) -> Literal[True]:
        """Always True; ``result.ok is True`` narrows an ``ExtractionResult`` to this class."""
        return True


class ExtractionFailure(msgspec.Struct, Generic[JobId], frozen=True):
    """A job a bulk call could not fetch: ``job_id`` exactly as given, and the ``error``.

    ``error`` is the ``AsyncSearchError`` that prevented it (``NotFoundError``, an exhausted
    retry, a bad body, an invalid id). A frozen msgspec Struct like ``ExtractionSuccess``, but
    tracked by the cyclic GC: an error's traceback can lead back to it.
    """

    job_id: JobId
    error: AsyncSearchError

    @property
    def job(self) -> None:
        """Always None: the job was not fetched."""
        return None

    @property
    def ok(self) -> Literal[False]:
        """Always False."""
        return False


if TYPE_CHECKING:
    ExtractionResult: TypeAlias = ExtractionSuccess[JobId] | ExtractionFailure[JobId]
else:

    class _UnionOfResults(type):
        def __instancecheck__(cls, instance: object) -> bool:
            return isinstance(instance, ExtractionSuccess | ExtractionFailure)

        def __subclasscheck__(cls, subclass: type) -> bool:
            return issubclass(subclass, ExtractionSuccess | ExtractionFailure)

        def __repr__(cls) -> str:
            return "asyncsearch.ExtractionResult"

    # At run time a class, not a bare union, so that help() shows this docstring,
    # isinstance() works, and ExtractionResult[str] can be evaluated (a union cannot).
    class ExtractionResult(metaclass=_UnionOfResults):
        """The outcome of fetching one extraction job in a bulk call.

        ``ExtractionSuccess[JobId] | ExtractionFailure[JobId]``, a union tagged by ``ok``:

        - ``isinstance(result, ExtractionSuccess)``, ``result.ok is True`` or ``match`` with
          ``case ExtractionSuccess(job=job)`` narrow it in mypy and pyright alike;
          ``if result.ok:`` narrows it in mypy only (pyright narrows no truthiness of an
          attribute);
        - a success has ``.job`` (an ``ExtractionJob``) and ``.error`` None, a failure
          ``.error`` (the ``AsyncSearchError``) and ``.job`` None;
        - ``job_id`` is the id exactly as given; ``ExtractionResult[str]`` is the result of a
          ``str`` id, and ``isinstance(x, ExtractionResult)`` works.
        """

        def __class_getitem__(cls, job_id: object) -> object:
            return ExtractionSuccess[job_id] | ExtractionFailure[job_id]


class ExtractionResults(AsyncClosing, Generic[JobId]):
    """The async iterator of ``ExtractionResult`` from ``iter_extractions``.

    Also an async context manager with ``aclose()``; leaving early in any way cancels the calls
    in flight and sends no more requests.
    """

    __slots__ = ("_outcomes", "_span")

    def __init__(self, outcomes: FanOut[JobId, ExtractionResult[JobId]], span: LazySpan) -> None:
        self._outcomes = outcomes
        self._span = span

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> ExtractionResult[JobId]:
        try:
            return _result_of(await self._outcomes.__anext__())
        except StopAsyncIteration:
            self._span.end()
            raise
        except BaseException as exc:
            self._span.end(exc)  # the fan-out ends with whatever escapes it
            raise

    async def aclose(self) -> None:
        """Stop: cancel the calls in flight and wait for them; calling it again does nothing."""
        await self._outcomes.aclose()
        self._span.end()

    def __del__(self) -> None:
        span = getattr(self, "_span", None)
        if span is not None:
            span.end()


def _result_of(outcome: Outcome[Id, ExtractionResult[Id]]) -> ExtractionResult[Id]:
    """The result of one id: the one the fetch function made, or its unexpected error."""
    value = outcome.value
    if value is not None:
        return value
    # The fetch function turns every AsyncSearchError into a result; anything else reaching here
    # is a bug below us, and it is still reported against its id rather than dropped.
    error = AsyncSearchError(f"unexpected error while fetching the job: {outcome.error!r}")
    error.__cause__ = outcome.error
    return ExtractionFailure(job_id=outcome.item, error=error)


def _not_sent(refused: APIStatusError) -> APIStatusError:
    """The error of an id a bulk call did not send after ``refused`` (a 401 or 403) came."""
    error = type(refused)(
        f"not sent: the service refused an earlier request of this bulk call ({refused.message})",
        status_code=refused.status_code,
        headers=refused.headers,
        body=refused.body,
        method=refused.method,
        url=refused.url,
    )
    error.__cause__ = refused
    return error


def _check_job_ids(job_ids: object) -> None:
    """Refuse, before anything is sent, what is not many ids: above all a single id string."""
    if isinstance(job_ids, str | bytes | bytearray | memoryview | uuid.UUID):
        raise InvalidRequestError(
            "job_ids must be an iterable of ids (a list, a set, a generator or an async "
            f"iterable), not a single {type(job_ids).__name__}: pass [job_id] for one id"
        )
    if not isinstance(job_ids, Iterable | AsyncIterable):
        raise InvalidRequestError(
            f"job_ids must be an iterable or an async iterable of ids, not {type(job_ids).__name__}"
        )


class AsyncSearchClient:
    """An async client of the content search and extraction service.

    Use it as ``async with AsyncSearchClient(...) as client:`` (or call ``await client.aclose()``).
    One client holds one connection pool; make it once and share it across tasks.

    Parameters:
        api_key: sent as ``X-Api-Key``; defaults to env ``ASYNCSEARCH_API_KEY``.
        base_url: the service's URL, may carry a path prefix; env ``ASYNCSEARCH_BASE_URL``.
        base_id: sends ``X-Service-Base-Id`` to run against that base.
        timeout: ``Timeout(connect=, read=, total=, pool=)`` per attempt, or a number of seconds
            (the total, capping the others); ``None`` turns every limit off; not given: the
            default ``Timeout()``.
        max_retries: retries after the first attempt (connection errors, timeouts, 408, 429, 5xx).
        max_connections: size of the connection pool (ignored when ``session`` is given); a
            call waits at most ``Timeout.pool`` for a free connection (``PoolTimeoutError``).
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
        retry_search: "safe" (the default) retries a search that is not ``incognito`` only after
            failures that show it was not acted on (the connection never opened; a 408, 429 or
            503 answer), so it never leaves two history entries; "always" retries it like a GET.
        tracing: make OpenTelemetry spans when ``opentelemetry-api`` is importable (the
            ``otel`` extra); with no SDK configured they cost next to nothing.
        trace_content: put the query text, image, request body and URL query on spans; not
            given: env ``ASYNCSEARCH_TRACE_CONTENT`` (``1``, ``true``, ``yes``), else off.

    Every endpoint method, pager and bulk helper also takes ``RequestOptions`` for one call:
    ``timeout``, ``max_retries``, ``extra_headers``, ``extra_query`` (and ``extra_body`` on
    searches).

    Raises ``ConfigurationError`` for a missing key or URL and for invalid options.
    """

    def __init__(
        self,
        api_key: str | None = None,
        *,
        base_url: str | None = None,
        base_id: str | None = None,
        timeout: Timeout | float | NotGiven | None = NOT_GIVEN,
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
        retry_search: SearchRetryPolicy = "safe",
        tracing: bool = True,
        trace_content: bool | None = None,
    ) -> None:
        if api_key is None:
            api_key = os.environ.get(ENV_API_KEY)
            if not api_key:
                raise ConfigurationError(f"api_key is missing: pass api_key= or set {ENV_API_KEY}")
        if base_url is None:
            base_url = os.environ.get(ENV_BASE_URL)
        _check_number("max_connections", max_connections, minimum=1, integer=True)
        if not isinstance(trust_env, bool):
            raise ConfigurationError("trust_env must be a bool")
        if not isinstance(retry_budget, RetryBudget | NotGiven | None):
            raise ConfigurationError("retry_budget must be an asyncsearch.RetryBudget or None")
        given = locals()  # the options of OptionChanges, by their names
        self._options = _make_options({name: given[name] for name in _OPTION_NAMES})
        transport = Transport(session=session, max_connections=max_connections, trust_env=trust_env)
        budget = RetryBudget() if isinstance(retry_budget, NotGiven) else retry_budget
        self._shared = _Shared(transport, budget)
        self._owns_transport = True
        self._closed = False

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

        Calling it twice is fine; using the client afterwards raises ``ClientClosedError``. It
        must run in the event loop the client was first used in (the pool's connections belong
        to it): from another one it raises ``ClientClosedError`` and closes nothing.
        """
        if self._owns_transport:
            # Raises ClientClosedError, closing nothing, from another event loop.
            await self._shared.transport.aclose()
        self._closed = True

    @property
    def is_closed(self) -> bool:
        """True once this client, or the client whose pool it shares, was closed."""
        return self._closed or self._shared.transport.closed

    def _check_open(self) -> None:
        if self.is_closed:
            raise ClientClosedError("the client is closed")

    def with_options(self, **changes: Unpack[OptionChanges]) -> AsyncSearchClient:
        """A client with some options changed that shares this one's pool and retry budget.

        Takes the options of ``AsyncSearchClient`` except ``max_connections``, ``session``,
        ``trust_env`` and ``retry_budget`` (those of the pool). ``base_id=None`` clears the base
        and ``timeout=None`` turns time limits off; an option not given keeps its value.
        ``headers`` are merged into the client's (a name in any case replaces the header of that
        name, a value of ``None`` removes it); ``headers=None`` removes them all.
        Closing the returned client does not close the shared pool.
        """
        self._check_open()
        for name in changes:
            if name not in _OPTION_NAMES:
                raise TypeError(f"with_options() got an unexpected keyword argument {name!r}")
        old = self._options
        current: dict[str, Any] = {name: getattr(old, name) for name in _OPTION_NAMES}
        new: dict[str, Any] = dict(changes)
        if new.get("headers") is not None:
            new["headers"] = _merge_headers(old.headers, new["headers"])
        child = object.__new__(AsyncSearchClient)
        child._options = _make_options({**current, **new})
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

    async def _send(
        self,
        request: Request[T],
        *,
        pressure: AdaptiveConcurrency | None = None,
        call: _Call | None = None,
        span: CallSpan = NO_SPAN,
    ) -> APIResponse[T]:
        """Send a request with retries; return the success response or raise its error.

        ``pressure`` is told about successes and overload answers (429, 503, with their
        ``Retry-After``), so that a bulk fetch can slow down as a whole. ``call`` holds the
        call's own options (its extras already applied to ``request``); ``span`` gets the
        retries.
        """
        opts = self._options
        shared = self._shared
        if self._closed or shared.transport.closed:  # self._check_open(), written out
            raise ClientClosedError("the client is closed")
        secret = opts.api_key.get()
        url = opts.base_url + request.target
        settings = opts if call is None else call
        headers = (
            settings.headers_without_body if request.body is None else settings.headers_with_body
        )
        timeout = settings.timeout
        max_retries = settings.max_retries
        # May the request be sent again once it may have reached the service? See retry_search.
        idempotent = request.idempotent or opts.retry_search == "always"
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
                    timeout=timeout,
                    max_response_bytes=opts.max_response_bytes,
                    max_redirects=opts.max_redirects,
                    ssl=opts.ssl,
                    secret=secret,
                    queued=pressure is not None,
                )
            except APIConnectionError as exc:
                exc.attempts = attempts
                path = request.path
                logger.debug(
                    "%s %s -> %s (attempt %d, %.3fs)",
                    request.method,
                    path,
                    type(exc).__name__,
                    attempts,
                    time.monotonic() - started,
                )
                if not protocol.is_retryable_connection_error(exc, idempotent=idempotent):
                    raise
                timed_out = isinstance(exc, APITimeoutError)
                if not self._may_retry(exc, attempts, max_retries, after_timeout=timed_out):
                    raise
                delay = self._backoff(attempts)
                self._log_retry(request, path, attempts, max_retries, delay, type(exc).__name__)
                span.retry(attempts, delay, type(exc).__name__)
                await _sleep(delay)
                continue
            except AsyncSearchError as exc:
                exc.attempts = attempts
                raise

            status = response.status
            if logger.isEnabledFor(logging.DEBUG):
                logger.debug(
                    "%s %s -> %d (attempt %d, %.3fs)",
                    request.method,
                    request.path,
                    status,
                    attempts,
                    response.elapsed,
                )
            if 200 <= status < 300:
                if shared.retry_budget is not None:
                    shared.retry_budget.on_success()
                if pressure is not None:
                    pressure.on_success()
                return _api_response(request, response, attempts, secret)

            path = request.path
            # The error keeps the headers: without the key, should the server have echoed it.
            response = msgspec.structs.replace(
                response, headers=scrub_headers(response.headers, secret)
            )
            retry_after = protocol.parse_retry_after(response.headers)
            if pressure is not None and status in (429, 503):
                pressure.on_overload()
                if retry_after is not None and retry_after <= opts.max_retry_after:
                    # The service asked everyone to wait, not only this call.
                    pressure.pause(retry_after)
            error = protocol.status_error(
                response,
                method=request.method,
                attempts=attempts,
                secret=secret,
                retry_after=retry_after,
                reason=_redirect_reason(response),
            )
            if not protocol.is_retryable_status(status, idempotent=idempotent):
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
            if not self._may_retry(error, attempts, max_retries, after_timeout=False):
                raise error
            delay = retry_after if retry_after is not None else self._backoff(attempts)
            self._log_retry(request, path, attempts, max_retries, delay, f"status {status}")
            span.retry(attempts, delay, f"status {status}")
            await _sleep(delay)

    def _may_retry(
        self, error: AsyncSearchError, attempts: int, max_retries: int, *, after_timeout: bool
    ) -> bool:
        """Whether another attempt may follow ``error``; says on the error why not, if not."""
        if attempts > max_retries:
            return False
        budget = self._shared.retry_budget
        if budget is not None and not budget.try_acquire(after_timeout=after_timeout):
            logger.debug("retry budget exhausted (%s tokens left); not retrying", budget.tokens)
            error.retries_stopped = (
                f"the client's retry budget is spent ({attempts - 1} of max_retries="
                f"{max_retries} retries made; see RetryBudget)"
            )
            return False
        return True

    def _backoff(self, attempts: int) -> float:
        return protocol.backoff_delay(
            attempts, base=BACKOFF_BASE, cap=BACKOFF_CAP, random=self._shared.random.random
        )

    def _log_retry(
        self,
        request: Request[Any],
        path: str,
        attempts: int,
        max_retries: int,
        delay: float,
        reason: str,
    ) -> None:
        logger.info(
            "retrying %s %s in %.2fs (attempt %d of %d failed: %s)",
            request.method,
            path,
            delay,
            attempts,
            max_retries + 1,
            reason,
        )

    # -- endpoints ---------------------------------------------------------------------------

    @property
    def with_raw_response(self) -> RawResponseClient:
        """The same endpoints, returning ``APIResponse`` with status, headers and attempts."""
        return RawResponseClient(self)

    def _check_page(self, name: str, page: object) -> None:
        # The spec fixes no bound for page; the client knows only where numbering starts.
        first = self._options.first_page
        if isinstance(page, int) and not isinstance(page, bool) and page < first:
            raise InvalidRequestError(
                f"{name} must be >= {first}, the client's first_page, got {page}"
            )

    @overload
    async def _call(
        self, name: str, request: Request[T], options: Mapping[str, Any], *, parse: Literal[True]
    ) -> T: ...

    @overload
    async def _call(
        self, name: str, request: Request[T], options: Mapping[str, Any], *, parse: Literal[False]
    ) -> APIResponse[T]: ...

    async def _call(
        self, name: str, request: Request[T], options: Mapping[str, Any], *, parse: bool
    ) -> T | APIResponse[T]:
        """Send one call's request under its span; its ``APIResponse``, or parsed if ``parse``."""
        call = _call_options(self._options, options, name)
        if call is not None:
            request = call.apply(request)
        with self._options.tracer.call(name, request) as span:
            response = await self._send(request, call=call, span=span)
            span.answered(response)
            return response.parse() if parse else response

    async def _search(
        self, text: str | None, embeddings: bool, params: SearchCallParams, *, parse: bool
    ) -> Any:
        self._check_open()
        options = {k: v for k, v in params.items() if k in _SEARCH_OPTIONS}
        search_params = cast(
            SearchParams, {k: v for k, v in params.items() if k not in _SEARCH_OPTIONS}
        )
        self._check_page("page", search_params.get("page"))
        request: Request[Any] = protocol.search(text, **search_params)
        if not embeddings:
            request = protocol.without_embeddings(request)
        call = _call_options(self._options, options, "search", search=True)
        if call is not None:
            request = call.apply(request)
        page_number = search_params.get("page")
        with self._options.tracer.call(
            "search",
            request,
            attributes=None if page_number is None else {"asyncsearch.search.page": page_number},
        ) as span:
            response = await self._send(request, call=call, span=span)
            span.answered(response)
            if not parse:
                if span is not NO_SPAN:
                    # Decoded once: the caller's parse() gets this page; a bad body is theirs.
                    with contextlib.suppress(ResponseValidationError):
                        span.set("asyncsearch.search.hits", len(response.parse().hits))
                return response
            page = response.parse()
            span.set("asyncsearch.search.hits", len(page.hits))
            return page

    async def search(
        self,
        text: str | None = None,
        *,
        embeddings: bool = True,
        **params: Unpack[SearchCallParams],
    ) -> SearchPage:
        """Search resources by text, image (a data URL) or similarity to a resource.

        Keyword arguments (``SearchParams``, every one optional): ``image``, ``resource_id``,
        ``filters``, ``precision``, ``queries``, ``incognito``, ``page``, ``page_size``, ``sort``;
        and the call's options (``SearchOptions``: ``timeout``, ``max_retries``,
        ``extra_headers``, ``extra_query``, ``extra_body``).
        ``filters`` and ``sort`` take the Struct or a dict with the same keys; arguments left as
        ``None`` are not sent. Each hit decodes its embeddings on first read of
        ``hit.embeddings`` (see ``SearchHit``); ``embeddings=False`` drops them once the page is
        parsed (``hit.embeddings`` is ``None``), so that the answer's bytes can be freed.
        Raises ``InvalidRequestError`` before sending when an argument is past the spec's
        limits (text over 255 characters, precision outside [0, 1], ...) or ``page`` is below
        the client's ``first_page``.
        """
        page: SearchPage = await self._search(text, embeddings, params, parse=True)
        return page

    async def get_extraction(
        self,
        job_id: str | uuid.UUID,
        *,
        format: ExtractionFormat | None = None,
        **options: Unpack[RequestOptions],
    ) -> ExtractionJob:
        """The result of an extraction job; ``format`` is "json" or "markdown".

        Raises ``NotFoundError`` when the job does not exist.
        """
        request = protocol.get_extraction(job_id, format=format)
        return await self._call("get_extraction", request, options, parse=True)

    async def link_preview(
        self, url: str, *, type: LinkType | None = None, **options: Unpack[RequestOptions]
    ) -> LinkPreview:
        """Open-graph data of a URL; ``type`` is "cache" or "link"."""
        request = protocol.link_preview(url, type=type)
        return await self._call("link_preview", request, options, parse=True)

    async def list_webhook_logs(
        self, job_id: str | uuid.UUID, **options: Unpack[RequestOptions]
    ) -> list[WebhookLogSummary]:
        """The webhook delivery attempts of an extraction job, in summary form."""
        request = protocol.list_webhook_logs(job_id)
        return await self._call("list_webhook_logs", request, options, parse=True)

    async def get_webhook_log(
        self, job_id: str | uuid.UUID, log_id: str | uuid.UUID, **options: Unpack[RequestOptions]
    ) -> WebhookLog:
        """One webhook delivery attempt with its request payload and response body."""
        request = protocol.get_webhook_log(job_id, log_id)
        return await self._call("get_webhook_log", request, options, parse=True)

    # -- paging ------------------------------------------------------------------------------

    def search_pages(
        self,
        text: str | None = None,
        *,
        start_page: int | None = None,
        max_pages: int | None = None,
        prefetch: bool = True,
        dedupe: bool = False,
        embeddings: bool = True,
        **params: Unpack[SearchWalkCallParams],
    ) -> SearchPager[SearchPage]:
        """Walk the pages of a search: ``async for page in client.search_pages("q"): ...``.

        Takes the arguments of ``search`` except ``page``. The walk starts at ``start_page``
        (default: the client's ``first_page``; a lower one is refused) and ends when
        ``has_more`` is false, when a page is empty, when a page repeats the previous one (a
        service ignoring the page number; a WARNING is logged) or at ``max_pages`` (logged at
        DEBUG: a cap you asked for). With ``prefetch`` the next page is requested while the
        caller works on the current one. ``dedupe`` drops hits already yielded in this walk.
        The call's options (``SearchOptions``) apply to every page's request. Arguments are
        validated now, before anything is sent.
        """
        return self._pager(
            "pages",
            text,
            params,
            start_page=start_page,
            max_pages=max_pages,
            max_items=None,
            prefetch=prefetch,
            dedupe=dedupe,
            embeddings=embeddings,
        )

    def search_hits(
        self,
        text: str | None = None,
        *,
        start_page: int | None = None,
        max_pages: int | None = None,
        prefetch: bool = True,
        dedupe: bool = False,
        max_items: int | None = None,
        embeddings: bool = True,
        **params: Unpack[SearchWalkCallParams],
    ) -> SearchPager[SearchHit]:
        """Walk the hits of a search across pages: ``async for hit in client.search_hits("q")``.

        Like ``search_pages``, yielding hits one by one, and stopping after ``max_items`` hits
        without fetching pages it does not need.
        """
        return self._pager(
            "items",
            text,
            params,
            start_page=start_page,
            max_pages=max_pages,
            max_items=max_items,
            prefetch=prefetch,
            dedupe=dedupe,
            embeddings=embeddings,
        )

    def _pager(
        self,
        mode: Literal["pages", "items"],
        text: str | None,
        all_params: SearchWalkCallParams,
        *,
        start_page: int | None,
        max_pages: int | None,
        max_items: int | None,
        prefetch: bool,
        dedupe: bool,
        embeddings: bool,
    ) -> SearchPager[Any]:
        self._check_open()
        function = "search_pages" if mode == "pages" else "search_hits"
        options = {k: v for k, v in all_params.items() if k in _SEARCH_OPTIONS}
        params = cast(
            SearchWalkParams, {k: v for k, v in all_params.items() if k not in _SEARCH_OPTIONS}
        )
        protocol.check_search_params(function, params, page=False)
        self._check_page("start_page", start_page)
        first = self._options.first_page if start_page is None else start_page
        # Validates every argument now, so a bad one fails at the call, not at the first page.
        call = _call_options(self._options, options, function, search=True)
        if call is not None and call.body is not None and "pagination" in call.body:
            raise InvalidRequestError(
                f"extra_body cannot set pagination on {function}(): the pager numbers the pages "
                "itself (pass page_size= and start_page=)"
            )
        request = protocol.search(text, **params, page=first)
        if call is not None:
            call.apply(request)  # the merged body passes the checks of the arguments
        tracer = self._options.tracer
        walk = LazySpan(
            tracer,
            function,
            {"asyncsearch.search.text": text} if tracer.content and text is not None else None,
        )

        def page_request(number: int) -> Request[Any]:
            request: Request[Any] = protocol.search(text, **params, page=number)
            if not embeddings:
                request = protocol.without_embeddings(request)
            return request if call is None else call.apply(request)

        def page_taken(number: int, page: SearchPage) -> None:
            hits = {"asyncsearch.search.page": number, "asyncsearch.search.hits": len(page.hits)}
            walk.event("asyncsearch.page", hits)

        # The body of the page before stays referenced until the next one is read. Freed at
        # once, a multi-MB body is handed back to the OS by glibc's allocator and faulted back in
        # for the next read: measured on 100-hit pages with embeddings, ~660 instead of ~150
        # minor page faults and 2-4 ms more system CPU per page. The cost is one body kept.
        held: list[bytes] = [b""]

        async def fetch_page(number: int) -> Any:
            request = page_request(number)
            with walk.child("search", request, {"asyncsearch.search.page": number}) as span:
                response = await self._send(request, call=call, span=span)
                span.answered(response)
                held[0] = response.content
                page = response.parse()
                span.set("asyncsearch.search.hits", len(page.hits))
            page_taken(number, page)
            return page

        # Pipelined walk of full pages: a page with embeddings takes about as long to decode as
        # a round trip, so the next request goes out before the page is decoded. Whether there
        # is a next page is read from the page's first bytes (search_page_continues: hasMore
        # and whether hits is empty, ~10 us), so the request goes out the moment the page is
        # in, and the decode overlaps all of the next round trip. When those bytes do not tell
        # (another key order), a view reads hasMore, total and the hit ids (skipping the rest,
        # ~1/3 of the full decode) and the pager decides on it before sending. Measured against
        # sending speculatively (no look at all): as fast, without a request past the end of
        # every walk. A page identical to the one before is not read early: a service that
        # ignores the page number is caught by the view before anything more is sent.
        # Pages decoded with embeddings=False are decoded in one go: no view, no pipelining.
        # Without prefetch
        # there is nothing to overlap, so the page is decoded in one go.
        async def fetch_received(number: int) -> _ReceivedPage:
            request = page_request(number)
            with walk.child("search", request, {"asyncsearch.search.page": number}) as span:
                response = await self._send(request, call=call, span=span)
                span.answered(response)
                span.hold()  # ended with its hit count, once the page is decoded
            repeated = response.content == held[0]
            held[0] = response.content
            received = _ReceivedPage(response, number, repeated=repeated, span=span)
            if span is not NO_SPAN:
                walk.finish_later(received)  # a page the walk never decodes
            return received

        def decode_received(received: _ReceivedPage) -> SearchPage:
            walk.finished(received)
            try:
                page = received.response.parse()
            except BaseException as exc:
                received.span.end(exc)
                raise
            received.finish(page)
            page_taken(received.number, page)
            return page

        pipelined = embeddings and prefetch
        return SearchPager(
            fetch_received if pipelined else fetch_page,
            mode=mode,
            start_page=first,
            page_items=attrgetter("hits"),
            item_key=attrgetter("id"),
            has_more=attrgetter("has_more"),
            page_total=attrgetter("total"),
            replace_items=_replace_hits,
            max_pages=max_pages,
            max_items=max_items,
            prefetch=prefetch,
            dedupe=dedupe,
            logger=logger,
            decode_page=decode_received if pipelined else None,
            peek=_received_continues if pipelined else None,
            page_size=params.get("page_size"),
            span=walk,
        )

    # -- bulk extraction results -------------------------------------------------------------

    def iter_extractions(
        self,
        job_ids: Iterable[Id] | AsyncIterable[Id],
        *,
        concurrency: int = 16,
        ordered: bool = False,
        format: ExtractionFormat | None = None,
        on_progress: Callable[[int, int | None], object] | None = None,
        **options: Unpack[RequestOptions],
    ) -> ExtractionResults[Id]:
        """Fetch many extraction jobs concurrently, yielding one ``ExtractionResult`` per id.

        ``job_ids`` (a plain or async iterable) is read lazily, so any number of ids runs in
        bounded memory. At most ``concurrency`` requests are in flight; on 429 and 503 answers
        fewer are sent and the number grows back as calls succeed, and a ``Retry-After`` pauses
        the whole batch. Results come as completed, or in input order with ``ordered=True``.
        A failed job becomes a result with ``.error``: every id given comes back exactly once per
        occurrence. ``on_progress(done, total)`` is called as ids finish; ``total`` is
        ``len(job_ids)`` when it has a length (a list, a tuple, a set) and ``None`` when it has
        not (a generator, an iterator, an async iterable): ``done`` still counts every id.
        The call's options (``RequestOptions``) apply to every request. Raises
        ``InvalidRequestError`` at once for a single id (a ``str``, ``bytes`` or ``uuid.UUID``
        instead of an iterable of them) and bad arguments.
        """
        _check_job_ids(job_ids)
        span = LazySpan(self._options.tracer, "iter_extractions")
        outcomes = self._extraction_fan_out(
            job_ids,
            concurrency=concurrency,
            ordered=ordered,
            format=format,
            on_progress=on_progress,
            call=_call_options(self._options, options, "iter_extractions"),
            span=span,
        )
        return ExtractionResults(outcomes, span)

    def _extraction_fan_out(
        self,
        job_ids: Iterable[Id] | AsyncIterable[Id],
        *,
        concurrency: int,
        ordered: bool,
        format: ExtractionFormat | None,
        on_progress: Callable[[int, int | None], object] | None,
        call: _Call | None,
        span: LazySpan,
    ) -> FanOut[Id, ExtractionResult[Id]]:
        self._check_open()
        protocol.check_extraction_format(format)
        check_int("concurrency", concurrency, minimum=1)
        # The one gate of each request: more in flight than the pool has connections would
        # only queue for the pool, and the connections it holds it takes from the pool itself.
        transport = self._shared.transport
        size = transport.pool_size
        pressure = AdaptiveConcurrency(min(concurrency, size or concurrency), pool=transport.pool)
        # The 401 or 403 that stops the call: every id would get the same answer, so once one
        # comes, nothing more is sent and every id not sent yet gets the error too.
        refused: list[APIStatusError] = []

        counts = span.totals  # set on the call's span when it ends
        counts["asyncsearch.bulk.ids"] = counts["asyncsearch.bulk.failed"] = 0

        async def fetch(job_id: Id) -> ExtractionResult[Id]:
            counts["asyncsearch.bulk.ids"] += 1
            if refused:
                counts["asyncsearch.bulk.failed"] += 1
                return ExtractionFailure(job_id=job_id, error=_not_sent(refused[0]))
            try:
                request = protocol.get_extraction(job_id, format=format)
                if call is not None:
                    request = call.apply(request)
                with span.child("get_extraction", request) as child:
                    response = await self._send(request, pressure=pressure, call=call, span=child)
                    child.answered(response)
                    job = response.parse()
            except (AuthenticationError, PermissionDeniedError) as exc:
                refused.append(exc)
                counts["asyncsearch.bulk.failed"] += 1
                return ExtractionFailure(job_id=job_id, error=exc)
            except ClientClosedError:
                raise  # ends the whole call (stop_on below): no error per id left
            except AsyncSearchError as exc:
                if self.is_closed:  # closed while this request was in flight
                    raise ClientClosedError("the client was closed during the bulk call") from exc
                counts["asyncsearch.bulk.failed"] += 1
                return ExtractionFailure(job_id=job_id, error=exc)
            return ExtractionSuccess(job_id=job_id, job=job)

        return limited_fan_out(
            fetch,
            job_ids,
            pressure,
            ordered=ordered,
            on_progress=on_progress,
            stop_on=ClientClosedError,
        )

    async def gather_extractions(
        self,
        job_ids: Iterable[Id] | AsyncIterable[Id],
        *,
        concurrency: int = 16,
        format: ExtractionFormat | None = None,
        on_progress: Callable[[int, int | None], object] | None = None,
        **options: Unpack[RequestOptions],
    ) -> list[ExtractionResult[Id]]:
        """Fetch many extraction jobs concurrently and return their results in input order.

        Like ``iter_extractions`` (any iterable or async iterable of ids; failed jobs are results
        with ``.error``, never dropped; ``on_progress`` gets ``None`` as the total when
        ``job_ids`` has no length), but collected into a list: use ``iter_extractions`` for more
        ids than fit in memory. A single id instead of an iterable raises ``InvalidRequestError``
        before anything is sent.
        """
        # Fetched as completed (an ordered fan-out would hold calls back behind a slow head),
        # each result put at its index by the fan-out itself: the whole list is kept anyway, so
        # nothing is gained by waking this task once per result as iter_extractions must.
        _check_job_ids(job_ids)
        span = LazySpan(self._options.tracer, "gather_extractions")
        try:
            async with self._extraction_fan_out(
                job_ids,
                concurrency=concurrency,
                ordered=False,
                format=format,
                on_progress=on_progress,
                call=_call_options(self._options, options, "gather_extractions"),
                span=span,
            ) as outcomes:
                results = await outcomes._gather(_result_of)
        except BaseException as exc:
            span.end(exc)
            raise
        span.end()
        return results

    async def wait_for_extraction(
        self,
        job_id: str | uuid.UUID,
        *,
        until: Callable[[ExtractionJob], bool] | Collection[str] | None = None,
        in_progress: Collection[str] | None = None,
        interval: float = 1.0,
        max_wait: float = 300.0,
        **options: Unpack[RequestOptions],
    ) -> ExtractionJob:
        """Poll a job until it is no longer in progress, and return it.

        By default it returns at the first poll that finds the job's state outside
        ``IN_PROGRESS_JOB_STATES`` (``pending``, the one state the spec names), whatever the
        state is: the spec names no final state, so none is assumed (a state not seen before is
        logged once at INFO). ``in_progress`` names the states to wait through instead, for a
        service known to use more (``in_progress={"pending", "processing"}`` for the bundled
        emulator). ``until`` takes the states to wait for instead (``until={"processing"}``) or
        a predicate of the job (``until=lambda job: job.extraction is not None``); it cannot be
        given with ``in_progress``. The interval
        grows with jitter up to 10 seconds. Raises ``WaitTimeoutError`` (carrying the last job
        seen in ``.job``) when ``max_wait`` seconds pass, including time spent in requests;
        errors that are not retried, such as ``NotFoundError``, propagate at once. The call's
        options (``RequestOptions``; ``timeout`` is per attempt, as everywhere) apply to every
        poll.
        """
        request = protocol.get_extraction(job_id)
        for name, value in (("interval", interval), ("max_wait", max_wait)):
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise InvalidRequestError(f"{name} must be a positive number, got {value!r}")
        call = _call_options(self._options, options, "wait_for_extraction")
        if call is not None:
            request = call.apply(request)
        if in_progress is not None and until is not None:
            raise InvalidRequestError("pass until= or in_progress=, not both")
        if until is not None:
            done = _until(until)
        elif in_progress is None:
            done = _not_in_progress
        else:
            waiting = _states("in_progress", in_progress)

            def done(job: ExtractionJob) -> bool:
                return job.state not in waiting

        span = LazySpan(self._options.tracer, "wait_for_extraction")
        last: ExtractionJob | None = None
        attempts = 0
        delay = float(interval)
        try:
            with anyio.move_on_after(max_wait) as scope:
                while True:
                    with span.child("get_extraction", request) as child:
                        response = await self._send(request, call=call, span=child)
                        child.answered(response)
                        last = response.parse()
                    attempts += response.attempts
                    if done(last):
                        if last.state is not None:
                            span.set("asyncsearch.job.state", last.state)
                        span.end()
                        return last
                    await _sleep(delay * (0.8 + 0.4 * self._shared.random.random()))
                    delay = min(delay * 1.5, WAIT_INTERVAL_CAP)
            assert scope.cancelled_caught
            state = last.state if last is not None else None
            raise WaitTimeoutError(
                f"extraction job {job_id} was not done after {max_wait:g}s (last state: {state!r})",
                job=last,
                attempts=attempts,
            )
        except BaseException as exc:
            span.end(exc)
            raise


#: The job states ``wait_for_extraction`` has already said it does not know (logged once each).
_reported_states: set[str | None] = set()


def _not_in_progress(job: ExtractionJob) -> bool:
    """``wait_for_extraction``'s default: the job's state is not one known to be in progress."""
    state = job.state
    if state in IN_PROGRESS_JOB_STATES:
        return False
    if state not in _reported_states:
        _reported_states.add(state)
        logger.info(
            "extraction job %s is in state %r, which asyncsearch does not know (the spec names "
            "only 'pending'); wait_for_extraction takes it as finished (pass until= to wait "
            "for something else)",
            job.id,
            state,
        )
    return True


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


class _ReceivedPage:
    """A search page as received: the response, not decoded yet.

    Answers ``hits`` (ids only), ``has_more`` and ``total`` like a page, from a view read on
    first use, so the pager's functions read it as they read a decoded page; ``continues``
    (``search_page_continues``) is the pager's ``peek``, read without the view.
    """

    __slots__ = ("_head", "continues", "number", "response", "span")

    def __init__(
        self,
        response: APIResponse[SearchPage],
        number: int,
        *,
        repeated: bool,
        span: CallSpan = NO_SPAN,
    ) -> None:
        self.response = response
        self.number = number
        self.continues = None if repeated else protocol.search_page_continues(response.content)
        self._head: SearchPageHead | None = None
        #: The page's request span, left open for its hit count (see ``finish``).
        self.span = span

    def finish(self, page: SearchPage | None = None) -> None:
        """End the page's span, with its hit count when known (decoded, or its view read)."""
        hits = page.hits if page is not None else None if self._head is None else self._head.hits
        if hits is not None:
            self.span.set("asyncsearch.search.hits", len(hits))
        self.span.end()

    def _view(self) -> SearchPageHead:
        head = self._head
        if head is None:
            try:
                head = protocol.search_page_head(self.response.content)
            except ResponseValidationError:
                # Raise the error of the full decode, which names SearchPage and the attempts
                # and keeps the key out of the body; should the full decode pass, read the page.
                try:
                    page = self.response.parse()
                except ResponseValidationError as exc:
                    self.span.end(exc)
                    raise
                head = SearchPageHead(
                    total=page.total,
                    has_more=page.has_more,
                    hits=[SearchHitId(id=hit.id) for hit in page.hits],
                )
            self._head = head
        return head

    @property
    def hits(self) -> list[SearchHitId]:
        return self._view().hits

    @property
    def has_more(self) -> bool:
        return self._view().has_more

    @property
    def total(self) -> int:
        return self._view().total


def _received_continues(received: _ReceivedPage) -> bool | None:
    return received.continues


def _replace_hits(page: Any, hits: list[Any]) -> Any:
    return msgspec.structs.replace(page, hits=hits)


def _states(name: str, states: object) -> frozenset[str]:
    """A non-empty collection of job states, checked."""
    if isinstance(states, str) or not isinstance(states, Collection) or not states:
        raise InvalidRequestError(
            f"{name} must be a non-empty collection of job states, got {states!r}"
        )
    for state in states:
        if not isinstance(state, str):
            raise InvalidRequestError(f"{name} holds {state!r}, which is not a job state")
    return frozenset(states)


def _until(
    until: Callable[[ExtractionJob], bool] | Collection[str],
) -> Callable[[ExtractionJob], bool]:
    if callable(until):
        return until
    if isinstance(until, str) or not isinstance(until, Collection) or not until:
        raise InvalidRequestError(
            f"until must be a non-empty collection of job states or a callable, got {until!r}"
        )
    states = _states("until", until)

    def reached(job: ExtractionJob) -> bool:
        return job.state in states

    return reached
