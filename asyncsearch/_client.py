"""``AsyncSearchClient``: construction, lifecycle, one method per endpoint, paging and bulk calls.

Its options are ``_config.Options``; each call goes through ``_call.send`` (attempts, retries,
budget). Each endpoint is declared once (``_Endpoint``), ``RawResponseClient`` derived from it.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import ssl as ssl_module
import uuid
from collections.abc import (
    AsyncIterable,
    Awaitable,
    Callable,
    Collection,
    Coroutine,
    Iterable,
    Mapping,
    Sequence,
)
from types import MethodType
from typing import (
    TYPE_CHECKING,
    Any,
    ClassVar,
    Concatenate,
    Generic,
    Literal,
    ParamSpec,
    Self,
    TypeAlias,
    TypeVar,
    Unpack,
    overload,
)

import anyio
import msgspec

from . import _call
from . import _protocol as protocol
from ._call import APIResponse, Shared, send
from ._checks import check_number
from ._concurrency import (
    AdaptiveConcurrency,
    AsyncClosing,
    FanOut,
    Outcome,
    RateLimit,
    RetryBudget,
    check_items,
    limited_fan_out,
)
from ._config import (
    CALL_CHANGES,
    DEFAULT_MAX_REDIRECTS,
    DEFAULT_MAX_RESPONSE_BYTES,
    DEFAULT_RETRY,
    NOT_GIVEN,
    OPTION_NAMES,
    REQUEST_OPTIONS,
    SEARCH_OPTIONS,
    ClientMiddleware,
    NotGiven,
    OptionChanges,
    Options,
    RequestOptions,
    RetryPolicy,
    SearchOptions,
    SearchRetryPolicy,
    Timeout,
)
from ._errors import (
    AsyncSearchError,
    AuthenticationError,
    ClientClosedError,
    ConfigurationError,
    InvalidRequestError,
    KeyProviderError,
    PermissionDeniedError,
    ProxyError,
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
    SearchPage,
    WebhookLog,
    WebhookLogSummary,
)
from ._paging import SearchPager
from ._protocol import Request, SearchParams, SearchWalkParams
from ._tracing import NO_SPAN, CallSpan, LazySpan
from ._transport import USER_AGENT, Transport

if TYPE_CHECKING:
    import aiohttp  # only for annotations: _transport.py is the one module that uses aiohttp
    import yarl

T = TypeVar("T")
P = ParamSpec("P")
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
WAIT_INTERVAL_CAP = 10.0
#: ``ASYNCSEARCH_LOG=debug`` (or ``info``, ``warning``, ``error``, ``critical``: the standard
#: level names, in any case): a quick look at what the client does, on stderr.
ENV_LOG = "ASYNCSEARCH_LOG"


def _setup_logging() -> None:
    """Give the ``asyncsearch`` logger a stderr handler and a level when ``ASYNCSEARCH_LOG`` asks.

    Nothing is changed when the variable is not set, or when the logger already has a handler
    (the application configured it).
    """
    value = os.environ.get(ENV_LOG, "").strip()
    names = logging.getLevelNamesMapping()
    level = names.get(value.upper(), logging.NOTSET)
    if value and level == logging.NOTSET:
        choices = ", ".join(sorted(name.lower() for name in names if name != "NOTSET"))
        message = "%s=%r is not a level name (%s); asyncsearch's logging is left as it is"
        logger.warning(message, ENV_LOG, value, choices)
    elif level != logging.NOTSET:
        if not logger.handlers:
            handler = logging.StreamHandler()
            handler.setFormatter(
                logging.Formatter("[%(asctime)s - %(name)s:%(lineno)d - %(levelname)s] %(message)s")
            )
            logger.addHandler(handler)
        logger.setLevel(level)


_setup_logging()


class SearchCallParams(SearchParams, SearchOptions, total=False):
    """Every keyword argument of ``search``: the search's ``SearchParams`` and the call's
    ``SearchOptions`` (``timeout``, ``max_retries``, ``extra_headers``, ...).

    Annotate a wrapper with it to pass both on::

        async def find(text: str, **params: Unpack[SearchCallParams]) -> SearchPage:
            return await client.search(text, **params)

        await find("invoice", page_size=5, timeout=10)
    """


class SearchWalkCallParams(SearchWalkParams, SearchOptions, total=False):
    """The keyword arguments of ``search_pages``/``search_hits`` after their own ones."""


class SearchPagesParams(SearchWalkCallParams, total=False):
    """The keyword arguments of ``search_pages`` (and ``search_hits``, which adds ``max_items``).

    Defaults: ``start_page`` the client's ``first_page``, ``max_pages`` none, ``prefetch`` True,
    ``dedupe`` False, ``embeddings`` True.
    """

    start_page: int | None
    """The first page walked (default: the client's ``first_page``; a lower one is refused)."""
    max_pages: int | None
    """The most pages walked; ``None``: no cap."""
    prefetch: bool
    """Request the next page while the caller works on the current one (default ``True``)."""
    dedupe: bool
    """Drop hits already yielded in this walk (default ``False``)."""
    embeddings: bool
    """``False`` drops the hits' vectors, as ``search`` does (default ``True``)."""


def _split(params: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A search's keywords: the call's options (``SearchOptions``), and the search's own."""
    options = {k: v for k, v in params.items() if k in SEARCH_OPTIONS}
    return options, {k: v for k, v in params.items() if k not in SEARCH_OPTIONS}


class _Prepared(msgspec.Struct, Generic[T], frozen=True):
    """One endpoint call ready to go: its request, the call's options, its span's attributes."""

    request: Request[T]
    options: Mapping[str, Any]
    attributes: Mapping[str, Any] | None = None


class _Endpoint(Generic[P, T]):
    """An endpoint declared once, by the method that prepares its request (``_Prepared``).

    Read on an ``AsyncSearchClient`` it is that method returning the parsed model; read on a
    ``RawResponseClient`` the same method returning the ``APIResponse``. Type checkers see both
    with the endpoint's own parameters (``P``) and precise result.
    """

    def __init__(self, prepare: Callable[Concatenate[AsyncSearchClient, P], _Prepared[T]]) -> None:
        self.parsed, self.raw = (_endpoint_method(prepare, raw=raw) for raw in (False, True))
        # Read on the class, it stands for the plain method (help(), inspect, an unbound call);
        # its __signature__ comes with the plain method's __dict__.
        functools.update_wrapper(self, self.parsed)

    def __call__(
        self, client: AsyncSearchClient, /, *args: P.args, **kwargs: P.kwargs
    ) -> Coroutine[Any, Any, T]:
        return self.parsed(client, *args, **kwargs)

    @overload
    def __get__(self, instance: None, owner: type[Any]) -> Self: ...

    @overload
    def __get__(
        self, instance: AsyncSearchClient, owner: type[Any]
    ) -> Callable[P, Coroutine[Any, Any, T]]: ...

    @overload
    def __get__(
        self, instance: RawResponseClient, owner: type[Any]
    ) -> Callable[P, Coroutine[Any, Any, APIResponse[T]]]: ...

    def __get__(self, instance: object, owner: type[Any]) -> Any:
        if instance is None:
            return self
        if isinstance(instance, RawResponseClient):
            return MethodType(self.raw, instance._client)
        return MethodType(self.parsed, instance)


def _endpoint_method(
    prepare: Callable[..., _Prepared[Any]], *, raw: bool
) -> Callable[..., Coroutine[Any, Any, Any]]:
    """The method of an endpoint: ``prepare``'s arguments, docstring and name, sent and answered.

    Its signature is ``prepare``'s, returning the model (``APIResponse`` of it if ``raw``).
    """

    name = prepare.__name__
    search = name == "search"

    async def method(client: AsyncSearchClient, /, *args: Any, **kwargs: Any) -> Any:
        # Sent under the call's span: its APIResponse if raw, else parsed.
        prepared = prepare(client, *args, **kwargs)
        call = client._call(name, prepared.options, SEARCH_OPTIONS if search else REQUEST_OPTIONS)
        request = call.apply(prepared.request)
        with client._options.tracer.call(name, request, attributes=prepared.attributes) as span:
            response = await client._send(call, request, span)
            span.answered(response)
            if search and span is not NO_SPAN:
                try:  # decoded once: parse() gives this page again
                    span.set("asyncsearch.search.hits", len(response.parse().hits))
                except ResponseValidationError:
                    if not raw:  # a bad body is the raw caller's, when it parses
                        raise
            return response if raw else response.parse()

    functools.update_wrapper(method, prepare)
    signature = inspect.signature(prepare)
    model = str(signature.return_annotation).removeprefix("_Prepared[").removesuffix("]")
    returns = f"APIResponse[{model}]" if raw else model
    method.__signature__ = signature.replace(return_annotation=returns)  # type: ignore[attr-defined]
    return method


class ExtractionSuccess(msgspec.Struct, Generic[JobId], frozen=True, gc=False):
    """A job fetched by a bulk call: ``job_id`` exactly as given, and its ``job``.

    ``error`` is always None and ``ok`` always True (``result.ok is True`` narrows an
    ``ExtractionResult`` to this class). A frozen msgspec Struct, not tracked by the cyclic GC
    (it holds an id and an acyclic job): ``gather_extractions`` keeps one per id until it
    returns, and a tracked object per id cost ~5 µs per id in collections.
    """

    job_id: JobId
    job: ExtractionJob
    ok: ClassVar[Literal[True]] = True
    error: ClassVar[None] = None


class ExtractionFailure(msgspec.Struct, Generic[JobId], frozen=True):
    """A job a bulk call could not fetch: ``job_id`` exactly as given, and the ``error``.

    ``error`` is the ``AsyncSearchError`` that prevented it (``NotFoundError``, an exhausted
    retry, a bad body, an invalid id); ``job`` is always None and ``ok`` always False. A frozen
    msgspec Struct like ``ExtractionSuccess``, but tracked by the cyclic GC: an error's
    traceback can lead back to it.
    """

    job_id: JobId
    error: AsyncSearchError
    ok: ClassVar[Literal[False]] = False
    job: ClassVar[None] = None


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
        except BaseException as exc:
            # The fan-out ends with whatever escapes it; at its end, without an error.
            self._span.end(None if isinstance(exc, StopAsyncIteration) else exc)
            raise

    async def _gather(self) -> list[ExtractionResult[JobId]]:
        """Every result, in input order, put at its index by the fan-out itself (``FanOut``)."""
        try:
            async with self._outcomes as outcomes:
                # A fetch returns the id's result: kept as it is (_result_of sees failures).
                results = await outcomes._gather(_result_of, values=True)
        except BaseException as exc:
            self._span.end(exc)
            raise
        self._span.end()
        return results

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


#: The errors of one id that stop a bulk call, every other id would get them too: a 401 or 403,
#: a key provider that fails, a proxy's 407 (a proxy's error that may be retried, a 502, does
#: not: see ``_bulk_results``).
_STOPS_BULK = (AuthenticationError, PermissionDeniedError, ProxyError, KeyProviderError)


def _not_sent(refused: AsyncSearchError) -> AsyncSearchError:
    """The error of an id a bulk call did not send after ``refused`` stopped it: a copy of it
    (its type, its attributes), saying so."""
    error = type(refused).__new__(type(refused))  # as unpickling makes it: no __init__
    error.__dict__.update(refused.__dict__, retries_stopped=None, attempts=0)
    error.message = f"not sent: an earlier request of this bulk call failed ({refused.message})"
    error.args = (error.message,)
    error.__cause__ = refused
    return error


_SESSION_MIDDLEWARES = (
    "middlewares cannot be given to a client made with session=: that session keeps its own "
    "(aiohttp.ClientSession(middlewares=...)), which the client does not replace"
)


class AsyncSearchClient(AsyncClosing):
    """An async client of the content search and extraction service.

    Use it as ``async with AsyncSearchClient(...) as client:`` (or call ``await client.aclose()``).
    One client holds one connection pool; make it once and share it across tasks.

    Every endpoint method, pager and bulk helper also takes ``RequestOptions`` for one call:
    ``timeout``, ``retry``, ``max_retries``, ``deadline``, ``middlewares``, ``extra_headers``,
    ``extra_query`` (and ``extra_body`` on searches).

    Args:
        api_key: Sent as ``X-Api-Key``: a string, or a function (sync or async) returning it,
            asked before each call (once for a bulk call) and once more after a 401; defaults
            to env ``ASYNCSEARCH_API_KEY``.
        base_url: The service's URL, may carry a path prefix; env ``ASYNCSEARCH_BASE_URL``.
        base_id: Sends ``X-Service-Base-Id`` to run against that base.
        timeout: ``Timeout(connect=, read=, total=, pool=)`` per attempt, or seconds (the total,
            capping the others); ``None`` turns every limit off; not given: ``Timeout()``.
        retry: The ``RetryPolicy``: which failures are retried, how often, and the waits; the
            default retries connection errors, timeouts, 408, 429 and 5xx twice.
        max_retries: Shorthand for ``retry``'s (over it): retries after the first attempt.
        deadline: Seconds a call may take in all, attempts and the waits between them (an
            attempt cut short raises ``APITimeoutError``; a retry whose wait would end past it
            is not made); ``None``: no bound but each attempt's ``timeout``.
        middlewares: aiohttp client middlewares (``async def mw(request, handler)``) run on
            every attempt; not with ``session`` (give them to that session).
        max_connections: Size of the connection pool (ignored when ``session`` is given); a
            call waits at most ``Timeout.pool`` for a free connection (``PoolTimeoutError``).
        session: An ``aiohttp.ClientSession`` to use; the client never closes it.
        headers: Extra headers on every request (they cannot replace the key or base id).
        ssl: An ``ssl.SSLContext``, e.g. to trust a private CA.
        trust_env: Take proxies and netrc from the environment, as aiohttp does.
        proxy: The proxy of every request (a ``str`` or ``yarl.URL``, ``http://`` or
            ``https://``), as aiohttp takes it; not with ``session``.
        proxy_auth: The proxy's credentials (``aiohttp.BasicAuth``); not with ``session``.
        max_response_bytes: Cap on a decoded body; past it ``ResponseTooLargeError``.
        allow_http: Allow a plain ``http://`` base URL to a host that is not loopback.
        max_retry_after: Shorthand for ``retry``'s (over it): the longest ``Retry-After``
            waited.
        max_redirects: How many same-origin redirects one attempt follows.
        retry_budget: A ``RetryBudget`` shared with ``with_options`` clients; ``None`` disables.
        rate_limit: A ``RateLimit`` (requests per second) shared with ``with_options`` clients.
        first_page: The number of the first page, used by the page iterators.
        retry_search: Shorthand for ``retry``'s (over it): ``"safe"`` or ``"always"``.
        tracing: OpenTelemetry spans when ``opentelemetry-api`` is importable (``otel`` extra);
            with no SDK configured they cost next to nothing.
        trace_content: Put the query text, image, request body and URL query on spans; not
            given: env ``ASYNCSEARCH_TRACE_CONTENT`` (``1``, ``true``, ``yes``), else off.

    Raises:
        ConfigurationError: A missing key or URL, or an option that is not valid.
    """

    def __init__(
        self,
        api_key: str | Callable[[], str | Awaitable[str]] | None = None,
        *,
        base_url: str | None = None,
        base_id: str | None = None,
        timeout: Timeout | float | NotGiven | None = NOT_GIVEN,
        retry: RetryPolicy = DEFAULT_RETRY,
        max_retries: int | NotGiven = NOT_GIVEN,
        deadline: float | None = None,
        middlewares: Sequence[ClientMiddleware] = (),
        max_connections: int = 100,
        session: aiohttp.ClientSession | None = None,
        headers: Mapping[str, str] | None = None,
        ssl: ssl_module.SSLContext | None = None,
        trust_env: bool = False,
        proxy: str | yarl.URL | None = None,
        proxy_auth: aiohttp.BasicAuth | None = None,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        allow_http: bool = False,
        max_retry_after: float | NotGiven = NOT_GIVEN,
        max_redirects: int = DEFAULT_MAX_REDIRECTS,
        retry_budget: RetryBudget | NotGiven | None = NOT_GIVEN,
        rate_limit: RateLimit | None = None,
        first_page: int = 1,
        retry_search: SearchRetryPolicy | NotGiven = NOT_GIVEN,
        tracing: bool = True,
        trace_content: bool | None = None,
    ) -> None:
        if api_key is None:
            api_key = os.environ.get(ENV_API_KEY)
            if not api_key:
                raise ConfigurationError(f"api_key is missing: pass api_key= or set {ENV_API_KEY}")
        base_url = os.environ.get(ENV_BASE_URL) if base_url is None else base_url
        given = locals()  # the options of OptionChanges, by their names
        # The pool's options checked first: the transport, the retry budget, the rate limit.
        check_number("max_connections", max_connections, minimum=1, error=ConfigurationError)
        if not isinstance(trust_env, bool):
            raise ConfigurationError("trust_env must be a bool")
        if not isinstance(retry_budget, RetryBudget | NotGiven | None):
            raise ConfigurationError("retry_budget must be an asyncsearch.RetryBudget or None")
        if not isinstance(rate_limit, RateLimit | None):
            raise ConfigurationError("rate_limit must be an asyncsearch.RateLimit or None")
        transport = Transport(session, max_connections, trust_env, proxy, proxy_auth)
        budget = RetryBudget() if isinstance(retry_budget, NotGiven) else retry_budget
        self._shared = Shared(transport, budget, rate_limit)
        values = {name: given[name] for name in OPTION_NAMES}
        options = Options.make(values, user_agent=USER_AGENT, proxy_secrets=transport.secrets)
        self._options = self._sendable(options, ConfigurationError)
        self._owns_transport = True
        self._closed = False

    # -- lifecycle ---------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        self._check_open()
        return self

    async def aclose(self) -> None:
        """Close the client. The pool closes with the client that made it, not with its copies.

        Calling it twice is fine; using the client afterwards raises ``ClientClosedError``. It
        must run in the event loop the client was first used in (the pool's connections belong
        to it): from another one it raises ``ClientClosedError`` and closes nothing. The client
        that owns the pool also calls its rate limit's ``release`` (a shared quota gets back the
        tokens this process leased and did not use).
        """
        if self._owns_transport:  # from another event loop: ClientClosedError, nothing closed
            await self._shared.transport.aclose()
            if self._shared.rate_limit is not None:
                await self._shared.rate_limit.release()  # a shared quota's unused lease goes back
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

        Takes the options of ``AsyncSearchClient`` but the pool's (``max_connections``,
        ``session``, ``trust_env``, ``proxy``, ``proxy_auth``, ``retry_budget``, ``rate_limit``).
        ``base_id=None`` clears the base, ``timeout=None`` turns time limits off, an option not
        given keeps its value; ``headers`` merge into the client's (a name in any case replaces
        that header, ``None`` removes it; ``headers=None`` removes them all).

        Args:
            **changes: The options to change (``OptionChanges``), as ``AsyncSearchClient``
                takes them.

        Returns:
            A new client (closing it does not close the shared pool); this one is unchanged.

        Raises:
            ClientClosedError: This client is closed.
            ConfigurationError: An option that is not valid, or one of the pool's.
        """
        self._check_open()
        options = self._sendable(self._options.merge(changes), ConfigurationError)
        child = object.__new__(AsyncSearchClient)
        # This client's state (open: checked above), with the pool and the budget it shares.
        child.__dict__.update(self.__dict__, _options=options, _owns_transport=False)
        return child

    def __repr__(self) -> str:
        opts, state = self._options, "closed" if self.is_closed else "open"
        base = f"base_url={opts.base_url!r} base_id={opts.base_id!r}"
        return f"<AsyncSearchClient {base} max_retries={opts.retry.max_retries} {state}>"

    # -- the request loop --------------------------------------------------------------------

    def _call(
        self, name: str, options: Mapping[str, Any], allowed: frozenset[str] = REQUEST_OPTIONS
    ) -> Options:
        """The options of one call of method ``name``: its ``options`` over the client's."""
        self._check_open()
        call = self._options.merge(
            options, function=name, allowed=allowed, error=InvalidRequestError, kinds=CALL_CHANGES
        )
        return self._sendable(call, InvalidRequestError)

    def _sendable(self, options: Options, error: type[AsyncSearchError]) -> Options:
        """``options``, or ``error`` when they have middlewares the client cannot run: a caller's
        ``session=`` runs its own (a per-request list would replace them)."""
        if options.middlewares and not self._shared.transport.owns_session:
            raise error(_SESSION_MIDDLEWARES)
        return options

    async def _send(self, call: Options, request: Request[T], span: CallSpan) -> APIResponse[T]:
        """Send ``request`` with retries under ``call``'s options (see ``_call.send``)."""
        self._check_open()
        return await send(self._shared, call, request, span)

    # -- endpoints ---------------------------------------------------------------------------

    @property
    def with_raw_response(self) -> RawResponseClient:
        """The same endpoints, returning ``APIResponse`` with status, headers and attempts."""
        return RawResponseClient(self)

    @_Endpoint
    def search(
        self,
        text: str | None = None,
        *,
        embeddings: bool = True,
        **params: Unpack[SearchCallParams],
    ) -> _Prepared[SearchPage]:
        """Search resources by text, image (a data URL) or similarity to a resource.

        Each hit decodes its embeddings on first read of ``hit.embeddings`` (see
        ``SearchHit``).

        Args:
            text: The query text (at most 255 characters), or ``None`` for an image or
                similarity search.
            embeddings: ``False`` drops the hits' vectors once the page is parsed
                (``hit.embeddings`` is ``None``), so that the answer's bytes can be freed.
            **params: The search's ``SearchParams`` (``image``, ``resource_id``, ``filters``,
                ``precision``, ``queries``, ``incognito``, ``page``, ``page_size``, ``sort``;
                every one optional, ``None`` not sent; ``filters`` and ``sort`` take the Struct
                or a dict with the same keys) and the call's ``SearchOptions``.

        Returns:
            One page of hits.

        Raises:
            InvalidRequestError: Before sending, when an argument is past the spec's limits
                (text over 255 characters, precision outside [0, 1], ...) or ``page`` is below
                the client's ``first_page``.
        """
        options, search = _split(params)
        page = search.get("page")
        _check_page(self, "page", page)
        request = protocol.search(text, **search)
        if not embeddings:
            request = protocol.without_embeddings(request)
        attributes = None if page is None else {"asyncsearch.search.page": page}
        return _Prepared(request, options, attributes)

    @_Endpoint
    def get_extraction(
        self,
        job_id: str | uuid.UUID,
        *,
        format: ExtractionFormat | None = None,
        **options: Unpack[RequestOptions],
    ) -> _Prepared[ExtractionJob]:
        """The result of an extraction job.

        Args:
            job_id: The job's id.
            format: ``"json"`` or ``"markdown"``; not sent when ``None``.
            **options: The call's ``RequestOptions``.

        Returns:
            The job, with its extraction once it has one.

        Raises:
            NotFoundError: The job does not exist.
        """
        return _Prepared(protocol.get_extraction(job_id, format=format), options)

    @_Endpoint
    def link_preview(
        self, url: str, *, type: LinkType | None = None, **options: Unpack[RequestOptions]
    ) -> _Prepared[LinkPreview]:
        """Open-graph data of a URL.

        Args:
            url: The page to preview.
            type: ``"cache"`` or ``"link"``; not sent when ``None``.
            **options: The call's ``RequestOptions``.

        Returns:
            The page's title, description, image and the like.
        """
        return _Prepared(protocol.link_preview(url, type=type), options)

    @_Endpoint
    def list_webhook_logs(
        self, job_id: str | uuid.UUID, **options: Unpack[RequestOptions]
    ) -> _Prepared[list[WebhookLogSummary]]:
        """The webhook delivery attempts of an extraction job, in summary form.

        Args:
            job_id: The job's id.
            **options: The call's ``RequestOptions``.

        Returns:
            One summary per delivery attempt.

        Raises:
            NotFoundError: The job does not exist.
        """
        return _Prepared(protocol.list_webhook_logs(job_id), options)

    @_Endpoint
    def get_webhook_log(
        self, job_id: str | uuid.UUID, log_id: str | uuid.UUID, **options: Unpack[RequestOptions]
    ) -> _Prepared[WebhookLog]:
        """One webhook delivery attempt with its request payload and response body.

        Args:
            job_id: The job's id.
            log_id: The delivery attempt's id (from ``list_webhook_logs``).
            **options: The call's ``RequestOptions``.

        Returns:
            The delivery attempt.

        Raises:
            NotFoundError: The job or the log does not exist.
        """
        return _Prepared(protocol.get_webhook_log(job_id, log_id), options)

    # -- paging ------------------------------------------------------------------------------

    def search_pages(
        self, text: str | None = None, **params: Unpack[SearchPagesParams]
    ) -> SearchPager[SearchPage]:
        """Walk the pages of a search: ``async for page in client.search_pages("q"): ...``.

        The walk ends when ``has_more`` is false, when a page is empty, when a page repeats the
        previous one (a service ignoring the page number; a WARNING is logged) or at
        ``max_pages`` (logged at DEBUG: a cap you asked for). Arguments are validated now,
        before anything is sent.

        Args:
            text: The query text, as ``search`` takes it.
            **params: The call's ``SearchOptions``, applied to every page's request.

        Returns:
            The pages, as an async iterator and context manager (``SearchPager``).

        Raises:
            InvalidRequestError: An argument that is not valid (before anything is sent).
        """
        return _search_pager(self, "search_pages", text, None, params)

    def search_hits(
        self,
        text: str | None = None,
        *,
        max_items: int | None = None,
        **params: Unpack[SearchPagesParams],
    ) -> SearchPager[SearchHit]:
        """Walk the hits of a search across pages: ``async for hit in client.search_hits("q")``.

        Like ``search_pages``, yielding hits one by one, and stopping after ``max_items`` hits
        without fetching pages it does not need; its arguments are checked now, as there.

        Args:
            text: The query text, as ``search`` takes it.
            max_items: The most hits yielded; ``None``: no cap.
            **params: The call's ``SearchOptions``, applied to every page's request.

        Returns:
            The hits, as an async iterator and context manager (``SearchPager``).
        """
        return _search_pager(self, "search_hits", text, max_items, params)

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

        On 429 and 503 answers fewer requests are sent and the number grows back as calls
        succeed, and a ``Retry-After`` pauses the whole batch. A failed job becomes a result
        with ``.error``: every id given comes back exactly once per occurrence.

        Args:
            job_ids: A plain or async iterable of ids, read lazily, so any number of ids runs in
                bounded memory.
            concurrency: The most requests in flight.
            ordered: Yield results in input order instead of as they complete.
            format: ``"json"`` or ``"markdown"``, as ``get_extraction`` takes it.
            on_progress: Called as ``on_progress(done, total)`` as ids finish; ``total`` is
                ``len(job_ids)``, or ``None`` when it has no length (a generator, an async
                iterable): ``done`` still counts every id.
            **options: The call's ``RequestOptions``, applied to every request.

        Returns:
            The results, as an async iterator and context manager (``ExtractionResults``).

        Raises:
            InvalidRequestError: At once, for bad arguments and a single id (a ``str``,
                ``bytes`` or ``uuid.UUID`` instead of an iterable of them).
        """
        fan = {"ordered": ordered, "on_progress": on_progress}
        return _bulk_results(self, "iter_extractions", job_ids, concurrency, format, options, **fan)

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

        Like ``iter_extractions`` (failed jobs are results with ``.error``, never dropped), but
        collected into a list: use ``iter_extractions`` for more ids than fit in memory.

        Args:
            job_ids: A plain or async iterable of ids.
            concurrency: The most requests in flight.
            format: ``"json"`` or ``"markdown"``, as ``get_extraction`` takes it.
            on_progress: Called as ``on_progress(done, total)`` as ids finish; ``total`` is
                ``None`` when ``job_ids`` has no length.
            **options: The call's ``RequestOptions``, applied to every request.

        Returns:
            One result per id given, in input order.

        Raises:
            InvalidRequestError: Before anything is sent, for bad arguments and a single id
                instead of an iterable.
        """
        # Fetched as completed (an ordered fan-out would hold calls back behind a slow head),
        # each result put at its index by the fan-out itself: the whole list is kept anyway, so
        # nothing is gained by waking this task once per result as iter_extractions must.
        fan = {"ordered": False, "on_progress": on_progress}
        results = _bulk_results(
            self, "gather_extractions", job_ids, concurrency, format, options, **fan
        )
        return await results._gather()

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
        logged once at INFO).

        Args:
            job_id: The job's id.
            until: The states to wait for instead (``until={"processing"}``), or a predicate of
                the job (``until=lambda job: job.extraction is not None``); not with
                ``in_progress``.
            in_progress: The states to wait through instead, for a service known to use more
                (``in_progress={"pending", "processing"}`` for the bundled emulator).
            interval: Seconds before the second poll; the interval grows with jitter up to 10
                seconds.
            max_wait: Seconds to wait in all, time spent in requests included.
            **options: The call's ``RequestOptions`` (``timeout`` is per attempt, as
                everywhere), applied to every poll.

        Returns:
            The job as the last poll found it.

        Raises:
            WaitTimeoutError: ``max_wait`` passed; the last job seen is its ``.job``.
            InvalidRequestError: Bad arguments, before anything is sent.
            APIStatusError: An error that is not retried, such as ``NotFoundError``, at once.
        """
        for name, value in (("interval", interval), ("max_wait", max_wait)):
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise InvalidRequestError(f"{name} must be a positive number, got {value!r}")
        call = self._call("wait_for_extraction", options)
        return await _polled(self, call, job_id, _done_when(until, in_progress), interval, max_wait)


async def _polled(
    client: AsyncSearchClient,
    call: Options,
    job_id: str | uuid.UUID,
    done: Callable[[ExtractionJob], bool],
    interval: float,
    max_wait: float,
) -> ExtractionJob:
    """``wait_for_extraction``'s polls of ``job_id`` under ``call``'s options, until ``done``."""
    request = call.apply(protocol.get_extraction(job_id))
    span = LazySpan(client._options.tracer, "wait_for_extraction")
    last: ExtractionJob | None = None
    attempts = 0
    delay = float(interval)
    try:
        with anyio.move_on_after(max_wait):
            while True:
                with span.child("get_extraction", request) as child:
                    response = await client._send(call, request, child)
                    child.answered(response)
                    last = response.parse()
                attempts += response.attempts
                if done(last):
                    if last.state is not None:
                        span.set("asyncsearch.job.state", last.state)
                    span.end()
                    return last
                await _call._sleep(delay * (0.8 + 0.4 * client._shared.random.random()))
                delay = min(delay * 1.5, WAIT_INTERVAL_CAP)
        # Only max_wait's cancellation ends the loop without a return.
        state = last.state if last is not None else None
        message = (
            f"extraction job {job_id} was not done after {max_wait:g}s (last state: {state!r})"
        )
        raise WaitTimeoutError(message, job=last, attempts=attempts)
    except BaseException as exc:
        span.end(exc)
        raise


def _check_page(client: AsyncSearchClient, name: str, page: object) -> None:
    # The spec fixes no bound for page; the client knows only where numbering starts.
    first = client._options.first_page
    if isinstance(page, int) and not isinstance(page, bool) and page < first:
        raise InvalidRequestError(f"{name} must be >= {first}, the client's first_page, got {page}")


def _search_pager(
    client: AsyncSearchClient,
    function: str,
    text: str | None,
    max_items: int | None,
    walk: SearchPagesParams,
) -> SearchPager[Any]:
    start_page = walk.pop("start_page", None)
    max_pages = walk.pop("max_pages", None)
    prefetch = walk.pop("prefetch", True)
    dedupe = walk.pop("dedupe", False)
    embeddings = walk.pop("embeddings", True)
    options, params = _split(walk)
    # Validates every argument now, so a bad one fails at the call, not at the first page.
    call = client._call(function, options, SEARCH_OPTIONS)
    protocol.check_search_params(function, params, page=False)
    _check_page(client, "start_page", start_page)
    first = client._options.first_page if start_page is None else start_page
    if call.body is not None and "pagination" in call.body:
        raise InvalidRequestError(
            f"extra_body cannot set pagination on {function}(): the pager numbers the pages "
            "itself (pass page_size= and start_page=)"
        )

    def page_request(number: int) -> Request[SearchPage]:
        request = protocol.search(text, **params, page=number)
        return call.apply(request if embeddings else protocol.without_embeddings(request))

    page_request(first)  # the merged body passes the checks of the arguments
    tracer = client._options.tracer
    content = tracer.content and text is not None
    return SearchPager(
        page_request,
        functools.partial(client._send, call),
        items=function == "search_hits",
        start_page=first,
        max_pages=max_pages,
        max_items=max_items,
        prefetch=prefetch,
        dedupe=dedupe,
        span=LazySpan(tracer, function, {"asyncsearch.search.text": text} if content else None),
    )


def _bulk_results(
    client: AsyncSearchClient,
    name: str,
    job_ids: Iterable[Id] | AsyncIterable[Id],
    concurrency: int,
    format: ExtractionFormat | None,
    options: Mapping[str, Any],
    **fan: Any,
) -> ExtractionResults[Id]:
    """The results of a bulk call: ``get_extraction`` of every id, under one span; ``fan``:
    ``ordered`` and ``on_progress``, as ``limited_fan_out`` takes them."""
    check_items(job_ids, "job_ids")
    call = client._call(name, options)
    protocol.check_extraction_format(format)
    check_number("concurrency", concurrency, minimum=1)
    # The one gate of each request, counting calls in flight: more than the pool has
    # connections would only queue for the pool (each attempt takes one, inside it).
    pool_size = client._shared.transport.pool_size
    pressure = AdaptiveConcurrency(min(concurrency, pool_size or concurrency))
    asked = call.api_key.asked  # a key provider's answer since the call began serves every id
    # The error that stops the call (_STOPS_BULK): every id would get the same, so once one
    # comes, nothing more is sent and every id not sent yet gets the error too.
    refused: list[AsyncSearchError] = []
    span = LazySpan(client._options.tracer, name)
    counts = span.totals  # set on the call's span when it ends
    counts["asyncsearch.bulk.ids"] = counts["asyncsearch.bulk.failed"] = 0

    async def fetch(job_id: Id) -> ExtractionResult[Id]:
        counts["asyncsearch.bulk.ids"] += 1
        error: AsyncSearchError
        if refused:
            error = _not_sent(refused[0])
        else:
            try:
                request = call.apply(protocol.get_extraction(job_id, format=format))
                with span.child("get_extraction", request) as child:
                    client._check_open()
                    response = await send(client._shared, call, request, child, pressure, asked)
                    child.answered(response)
                    return ExtractionSuccess(job_id=job_id, job=response.parse())
            except ClientClosedError:
                raise  # ends the whole call (stop_on below): no error per id left
            except AsyncSearchError as exc:
                if client.is_closed:  # closed while this request was in flight
                    raise ClientClosedError("the client was closed during the bulk call") from exc
                if isinstance(exc, _STOPS_BULK) and not getattr(exc, "retryable", False):
                    refused.append(exc)
                error = exc
            except Exception as exc:  # a middleware's own error: this id's, as its cause
                error = AsyncSearchError(f"a middleware raised {type(exc).__name__}: {exc}")
                error.__cause__ = exc
        counts["asyncsearch.bulk.failed"] += 1
        return ExtractionFailure(job_id=job_id, error=error)

    outcomes = limited_fan_out(fetch, job_ids, pressure, stop_on=ClientClosedError, **fan)
    return ExtractionResults(outcomes, span)


class RawResponseClient:
    """The client's endpoints returning ``APIResponse`` (status, headers, attempts) instead.

    Reached as ``client.with_raw_response``; every method takes exactly the arguments of the
    client method of the same name, and ``APIResponse.parse()`` gives what that method returns.
    The endpoints are the client's own (``_Endpoint``), not declared again.

    Args:
        client: The client whose endpoints these are.
    """

    __slots__ = ("_client",)

    def __init__(self, client: AsyncSearchClient) -> None:
        self._client = client

    search = AsyncSearchClient.search
    get_extraction = AsyncSearchClient.get_extraction
    link_preview = AsyncSearchClient.link_preview
    list_webhook_logs = AsyncSearchClient.list_webhook_logs
    get_webhook_log = AsyncSearchClient.get_webhook_log

    def __repr__(self) -> str:
        return f"<RawResponseClient of {self._client!r}>"


#: The job states ``wait_for_extraction`` has already said it does not know (logged once each).
_reported_states: set[str | None] = set()


def _done_when(
    until: Callable[[ExtractionJob], bool] | Collection[str] | None,
    in_progress: Collection[str] | None,
) -> Callable[[ExtractionJob], bool]:
    """``wait_for_extraction``'s test of a polled job, from its ``until`` or ``in_progress``.

    By default a job is done once its state is not in ``IN_PROGRESS_JOB_STATES``; a state that
    ends a wait so is logged the first time (asyncsearch does not know it).
    """
    if in_progress is not None and until is not None:
        raise InvalidRequestError("pass until= or in_progress=, not both")
    if callable(until):
        return until
    reached = until is not None
    name, given = ("until", until) if reached else ("in_progress", in_progress)
    if given is not None:
        if isinstance(given, str) or not isinstance(given, Collection) or not given:
            alternative = " or a callable" if reached else ""
            raise InvalidRequestError(
                f"{name} must be a non-empty collection of job states{alternative}, got {given!r}"
            )
        for state in given:
            if not isinstance(state, str):
                raise InvalidRequestError(f"{name} holds {state!r}, which is not a job state")
    states = IN_PROGRESS_JOB_STATES if given is None else frozenset(given)

    def done(job: ExtractionJob) -> bool:
        finished = (job.state in states) is reached
        if given is None and finished and job.state not in _reported_states:
            _reported_states.add(job.state)
            logger.info(
                "extraction job %s is in state %r, which asyncsearch does not know (the spec "
                "names only 'pending'); wait_for_extraction takes it as finished (pass until= "
                "to wait for something else)",
                job.id,
                job.state,
            )
        return finished

    return done
