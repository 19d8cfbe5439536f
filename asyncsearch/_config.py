"""Every option of a client and of one call, in one type (``Options``), with its checks.

Also ``Timeout``, the defaults and the "not given" sentinel.
"""

from __future__ import annotations

import asyncio
import enum
import math
import os
import ssl as ssl_module
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, Final, Literal, TypeAlias, TypedDict, TypeVar

from . import _protocol as protocol
from ._checks import check_number, check_positive, running_loop
from ._errors import AsyncSearchError, ConfigurationError
from ._protocol import Secrets
from ._tracing import ENV_TRACE_CONTENT, Tracing

if TYPE_CHECKING:
    from ._protocol import Request

T = TypeVar("T")


class NotGiven(enum.Enum):
    """The type of ``NOT_GIVEN``: tells an option not passed from one passed as ``None``."""

    NOT_GIVEN = enum.auto()

    def __repr__(self) -> str:
        return "NOT_GIVEN"

    def __bool__(self) -> Literal[False]:
        return False


NOT_GIVEN: Final = NotGiven.NOT_GIVEN


@dataclass(frozen=True, slots=True)
class Timeout:
    """Per-attempt time limits in seconds; ``None`` disables one limit.

    ``connect`` bounds opening a connection, ``read`` bounds every wait for data from the server,
    and ``total`` bounds the whole attempt from the moment it has a connection, body included.
    ``pool`` bounds waiting for a free connection of the client's own pool (``max_connections``)
    before that: the client's own congestion, not the server's, so running past it raises
    ``PoolTimeoutError``, which is never retried. The default has every limit finite, so a silent
    server never hangs a caller; ``pool`` defaults to the default ``total``, so a call queued
    behind a full pool of calls that each use their whole ``total`` still gets its turn.

    Args:
        connect: Seconds to open a connection (TCP, TLS, a proxy's tunnel).
        read: Seconds of every wait for data from the server.
        total: Seconds for the whole attempt once it has a connection, body included.
        pool: Seconds to wait for a free connection of the client's pool.

    Raises:
        ConfigurationError: A limit that is neither a positive number nor ``None``.
    """

    connect: float | None = 10.0
    read: float | None = 60.0
    total: float | None = 180.0
    pool: float | None = 180.0

    def __post_init__(self) -> None:
        for name in ("connect", "read", "total", "pool"):
            if (value := getattr(self, name)) is not None:
                check_positive(f"Timeout.{name}", value, also=" or None")

    @classmethod
    def coerce(cls, value: Timeout | float | NotGiven | None) -> Timeout:
        """Turn the ``timeout`` option into a ``Timeout``.

        Args:
            value: Not given: the default. ``None``: no limit at all (as in httpx). A number: the
                total per attempt, with the other limits capped by it. A ``Timeout``: itself.

        Returns:
            The limits of one attempt.

        Raises:
            ConfigurationError: A number that is not positive, or a value of another type.
        """
        if isinstance(value, NotGiven):
            return DEFAULT_TIMEOUT
        if value is None:
            return NO_TIMEOUT
        if isinstance(value, Timeout):
            return value
        # Checked here, so that the message names what was passed, not the limit of Timeout
        # that the number would have become.
        check_positive("timeout", value, also=", an asyncsearch.Timeout or None")
        # A single number bounds the attempt; no other limit may exceed it.
        return cls(
            connect=min(DEFAULT_TIMEOUT.connect or value, value),
            read=min(DEFAULT_TIMEOUT.read or value, value),
            total=value,
            pool=min(DEFAULT_TIMEOUT.pool or value, value),
        )


DEFAULT_TIMEOUT: Final = Timeout()
#: What ``timeout=None`` means: no limit on any phase.
NO_TIMEOUT: Final = Timeout(connect=None, read=None, total=None, pool=None)
#: Large enough for a 1000-hit page with both embeddings (about 24 MB of JSON), with room to spare.
DEFAULT_MAX_RESPONSE_BYTES: Final = 64 * 1024 * 1024
DEFAULT_MAX_RETRY_AFTER: Final = 60.0
DEFAULT_MAX_REDIRECTS: Final = 5

#: The ``retry_search`` rule: see ``RetryPolicy``.
SearchRetryPolicy: TypeAlias = Literal["safe", "always"]
#: An aiohttp client middleware (``aiohttp.ClientMiddlewareType``): ``async def mw(request,
#: handler)`` returning ``await handler(request)``'s response.
ClientMiddleware: TypeAlias = Callable[[Any, Any], Awaitable[Any]]


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """Which failures of a call are tried again, and how long to wait before each retry.

    The retry budget is not here: it is shared by every call of the pool (``retry_budget``).

    Args:
        max_retries: Retries after the first attempt.
        statuses: The answer statuses retried (default 408, 429 and every 5xx); connection
            errors and timeouts are retried whatever this holds. Any collection of statuses;
            kept as a ``frozenset``.
        base: With ``cap`` and ``jitter``: the wait before retry ``n`` is at most
            ``min(cap, base * 2**(n-1))`` seconds.
        cap: The longest backoff wait, in seconds.
        jitter: Full jitter: wait a uniform draw below the backoff; without it, exactly that.
        max_retry_after: The longest wait the server may ask for (``retry-after-ms``, or
            ``Retry-After`` in seconds or as an HTTP date), waited instead of the backoff; an
            answer asking for longer is raised at once.
        retry_search: ``"safe"`` retries a search that is not ``incognito`` (the one request
            that is not idempotent) only after failures that show it was not acted on (the
            connection never opened; a 408, 429 or 503 answer), so it never leaves two history
            entries; ``"always"`` retries it like a GET.

    Raises:
        ConfigurationError: A value out of its range or of the wrong type.
    """

    max_retries: int = 2
    statuses: Collection[int] = protocol.RETRYABLE_STATUSES
    base: float = 0.5
    cap: float = 8.0
    jitter: bool = True
    max_retry_after: float = DEFAULT_MAX_RETRY_AFTER
    retry_search: SearchRetryPolicy = "safe"

    def __post_init__(self) -> None:
        check_number("max_retries", self.max_retries, minimum=0, error=ConfigurationError)
        for name in ("base", "cap", "max_retry_after"):
            check_number(
                name, getattr(self, name), minimum=0, integer=False, error=ConfigurationError
            )
        statuses: object = self.statuses
        if isinstance(statuses, str | bytes) or not isinstance(statuses, Iterable):
            raise ConfigurationError(f"statuses must be a set of HTTP statuses, got {statuses!r}")
        # A frozenset is kept as it is: the default one's repr reads "408, 429, every 5xx".
        if not isinstance(statuses, frozenset):
            statuses = frozenset(statuses)
        if not all(
            isinstance(s, int) and not isinstance(s, bool) and 100 <= s <= 599 for s in statuses
        ):
            raise ConfigurationError(
                f"statuses must hold HTTP statuses (100-599), got {self.statuses!r}"
            )
        object.__setattr__(self, "statuses", statuses)
        if not isinstance(self.jitter, bool):
            raise ConfigurationError("jitter must be a bool")
        if self.retry_search not in ("safe", "always"):
            raise ConfigurationError(
                f"retry_search must be 'safe' or 'always', got {self.retry_search!r}"
            )


#: The keywords that set one field of ``RetryPolicy`` each, kept from before it.
_RETRY_SHORTHANDS: Final = frozenset({"max_retries", "max_retry_after", "retry_search"})


class _AttemptOptions(TypedDict, total=False):
    """The keywords that both a client and one call take (see ``RequestOptions``)."""

    timeout: Timeout | float | None
    retry: RetryPolicy
    max_retries: int
    deadline: float | None
    middlewares: Sequence[ClientMiddleware]


class RequestOptions(_AttemptOptions, total=False):
    """Options of one call, taken as keywords by every endpoint method, pager and bulk helper.

    Every one is optional; one not given keeps the client's value. A pager or bulk helper
    applies them to each of its requests.

    - ``timeout``: this call's ``Timeout`` per attempt, as the client option takes it (a
      ``Timeout``, a number of seconds for the total, or ``None`` for no limit).
    - ``retry``: this call's ``RetryPolicy``; ``max_retries`` sets only its ``max_retries``.
    - ``deadline``: seconds this call may take in all, attempts and waits between them;
      ``None``: no bound but each attempt's ``timeout``.
    - ``middlewares``: aiohttp client middlewares run on each attempt of this call, after the
      client's own.
    - ``extra_headers``: headers added to the client's; they cannot replace ``X-Api-Key`` or
      ``X-Service-Base-Id`` (``InvalidRequestError``).
    - ``extra_query``: query parameters added to the URL; one the SDK sends is replaced.
    """

    extra_headers: Mapping[str, str]
    extra_query: Mapping[str, str | int | float | bool]


class SearchOptions(RequestOptions, total=False):
    """The options of a search call: ``RequestOptions`` and ``extra_body``.

    - ``extra_body``: fields merged into the JSON body (a field the SDK sends is replaced), for
      fields the service may take that the spec does not show.
    """

    extra_body: Mapping[str, Any]


class OptionChanges(_AttemptOptions, total=False):
    """The keywords of ``with_options``: the options of ``AsyncSearchClient`` but the pool's.

    (``max_connections``, ``session``, ``trust_env``, ``proxy``, ``proxy_auth``,
    ``retry_budget`` and ``rate_limit`` belong to the pool, which the clients made by
    ``with_options`` share.) ``api_key`` takes a string or a key provider, as the client does.
    """

    api_key: str | Callable[[], str | Awaitable[str]]
    base_url: str
    base_id: str | None
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


OPTION_NAMES: Final = OptionChanges.__optional_keys__
REQUEST_OPTIONS: Final = RequestOptions.__optional_keys__
SEARCH_OPTIONS: Final = SearchOptions.__optional_keys__
#: The field of ``Options`` each keyword of a call sets.
_CALL_FIELDS: Final = {
    "extra_headers": "headers",
    "extra_query": "query",
    "extra_body": "body",
    "extra_middlewares": "middlewares",
}
#: What a call's keywords change, where the keyword of a client means another change: a call's
#: ``middlewares`` are added inside the client's (a client's replace them).
CALL_CHANGES: Final = {"middlewares": "extra_middlewares"}


#: The tracer of options not made by ``merge`` yet: traces nothing.
_NO_TRACING: Final = Tracing(base_url="", enabled=False, content=False)


class _Key:
    """Holds the API key, or the function giving it, so that no repr, log or traceback shows it.

    With a ``provider`` (``api_key=`` a sync or async function returning the key), ``get()`` is
    the key it returned last ("" before its first answer) and ``asked`` counts its answers. An
    async provider is asked one question at a time: a call that asks while a question is in
    flight takes that question's answer (or its error).
    """

    __slots__ = ("_flight", "_value", "asked", "provider")

    def __init__(self, value: str, provider: Callable[[], str | Awaitable[str]] | None = None):
        self._value = value
        self.provider = provider
        self.asked = 0
        self._flight: asyncio.Future[tuple[str, int]] | None = None

    def get(self) -> str:
        return self._value

    async def ask(self, after: int | None) -> tuple[str, int]:
        """The provider's latest key and its answer's number: asked now (or the question in
        flight joined), unless it has answered since its answer number ``after`` (``None``:
        asked in any case).

        The provider's error is raised as it raised it, to every call that asked it.
        """
        while self.provider is not None and after in (None, self.asked):
            if (flight := self._flight) is not None:
                # asyncio.wait, not await: a call that stops waiting leaves the question running.
                await asyncio.wait((flight,))
                if not flight.cancelled():  # else the call that asked it stopped: ask again
                    return flight.result()
                continue
            flight = self._flight = running_loop().create_future()
            try:  # asked in this task, for every call that joins meanwhile
                key = self.provider()
                key = await key if isinstance(key, Awaitable) else key
                self._value = _check_text("the key the api_key provider returned", key)
                self.asked += 1
                flight.set_result((self._value, self.asked))
            except Exception as exc:
                flight.set_exception(exc)
                flight.exception()  # retrieved here: nobody may have joined
                raise
            finally:
                self._flight = None
                # Answered, this does nothing; else this call was cancelled (or interrupted) as
                # it asked: the calls that joined ask again.
                flight.cancel()
            break
        return self._value, self.asked

    def __repr__(self) -> str:
        return "<secret>"


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class Options:
    """Every option of a client, or of one call of it, checked; ``merge`` makes a changed copy.

    The constructor, ``with_options`` and each call's ``RequestOptions`` all go through
    ``merge``: a client's options are ``merge`` of its keywords over nothing, a derived client's
    ``merge`` of its changes over its parent's, one call's ``merge`` of its keywords over its
    client's (``query`` and ``body`` are a call's ``extra_query`` and ``extra_body``).
    """

    api_key: _Key
    base_url: str
    base_id: str | None
    timeout: Timeout
    retry: RetryPolicy
    deadline: float | None
    middlewares: tuple[ClientMiddleware, ...]
    headers: Mapping[str, str]
    ssl: ssl_module.SSLContext | None
    max_response_bytes: int
    allow_http: bool
    max_redirects: int
    first_page: int
    tracing: bool
    trace_content: bool | None
    #: Sent as ``User-Agent``; set by the client (the transport knows the aiohttp version).
    user_agent: str = field(default="", repr=False)
    #: The proxy's credentials in every form (``Transport.secrets``), set by the client.
    proxy_secrets: frozenset[str] = field(default=frozenset(), repr=False)
    query: tuple[tuple[str, str], ...] = ()
    body: Mapping[str, Any] | None = None
    # Derived by merge, once per client or call instead of once per request.
    headers_without_body: Mapping[str, str] = field(default_factory=dict, repr=False)
    headers_with_body: Mapping[str, str] = field(default_factory=dict, repr=False)
    tracer: Tracing = field(default_factory=lambda: _NO_TRACING, repr=False)
    #: What is scrubbed from an error of a call: the proxy's secrets and every key it sent.
    secrets: Secrets = field(default_factory=Secrets, repr=False)

    @classmethod
    def make(
        cls, values: Mapping[str, Any], *, user_agent: str, proxy_secrets: frozenset[str]
    ) -> Options:
        """The options of a new client: its keywords (``OptionChanges``, all of them), checked."""
        blank: dict[str, Any] = {
            **dict.fromkeys(OPTION_NAMES - _RETRY_SHORTHANDS),
            "headers": {},
            "retry": DEFAULT_RETRY,
            "middlewares": (),
        }
        made = cls(**blank, user_agent=user_agent, proxy_secrets=proxy_secrets)
        return made.merge(values, function="AsyncSearchClient")

    def merge(
        self,
        changes: Mapping[str, Any],
        *,
        function: str = "with_options",
        allowed: frozenset[str] = OPTION_NAMES,
        error: type[AsyncSearchError] = ConfigurationError,
        kinds: Mapping[str, str] = {},
    ) -> Options:
        """These options with ``changes`` (keywords of ``function``, among ``allowed``) over them.

        Each change is checked (``error`` for a bad value; ``TypeError`` for a name not in
        ``allowed``) and applied by what it changes: ``kinds`` names a keyword's change where it
        is not the keyword's own (``CALL_CHANGES``); ``headers`` merge into these ones (a value
        of None removes one they have, see ``with_options``). ``function`` only names the
        caller in a message.
        """
        if not changes:
            return self
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        retry_changes: dict[str, Any] = {}
        try:
            for name, value in changes.items():
                if name not in allowed:
                    raise TypeError(f"{function}() got an unexpected keyword argument {name!r}")
                if name not in _RETRY_SHORTHANDS:
                    kind = kinds.get(name, name)
                    values[_CALL_FIELDS.get(kind, kind)] = _check(kind, value, self, error)
                elif not isinstance(value, NotGiven):
                    retry_changes[name] = value  # over ``retry``, whatever the order
            if retry_changes:
                values["retry"] = replace(values["retry"], **retry_changes)
        except ConfigurationError as exc:
            if error is ConfigurationError:
                raise
            raise error(exc.message) from None
        if "base_url" in changes or "allow_http" in changes:
            values["base_url"] = protocol.check_base_url(
                values["base_url"], allow_http=values["allow_http"]
            )
        return _derive(values, self)

    def keyed(self, key: str) -> Options:
        """These options sending ``key``: a call's, of a client whose ``api_key`` is a provider."""
        names = ("headers_without_body", "headers_with_body")
        headers: dict[str, Any] = {n: {**getattr(self, n), "X-Api-Key": key} for n in names}
        # The keys sent before in this call stay secrets too.
        return replace(
            self, api_key=_Key(key), secrets=Secrets({*self.secrets.texts, key}), **headers
        )

    def apply(self, request: Request[T]) -> Request[T]:
        """The request with this call's ``extra_query`` and ``extra_body``."""
        if self.query or self.body:
            return protocol.with_extras(request, query=self.query, body=self.body)
        return request


def _derive(values: dict[str, Any], old: Options) -> Options:
    """``Options`` of ``values``, with the request headers and the tracer derived once."""
    if any(values[name] != getattr(old, name) for name in ("api_key", "base_id", "headers")):
        values["headers_without_body"], values["headers_with_body"] = (
            protocol.build_headers(
                api_key=values["api_key"].get(),
                base_id=values["base_id"],
                user_agent=values["user_agent"],
                extra=values["headers"],
                has_body=has_body,
            )
            for has_body in (False, True)
        )
        values["secrets"] = Secrets({*values["proxy_secrets"], values["api_key"].get()})
    if any(values[name] != getattr(old, name) for name in ("base_url", "tracing", "trace_content")):
        content = values["trace_content"]
        if content is None:
            content = os.environ.get(ENV_TRACE_CONTENT, "").strip().lower() in ("1", "true", "yes")
        values["tracer"] = Tracing(
            base_url=values["base_url"], enabled=values["tracing"], content=content
        )
    return Options(**values)


def _check(name: str, value: Any, old: Options, error: type[AsyncSearchError]) -> Any:
    """The change ``name`` (a keyword of a client or of a call) checked; ``error`` if bad."""
    match name:
        case "api_key":
            if isinstance(value, _Key):
                return value
            return _Key("", value) if callable(value) else _Key(_check_text(name, value))
        case "base_url":
            return value  # checked by merge, with allow_http
        case "base_id":
            return None if value is None else _check_text(name, value)
        case "timeout":
            return Timeout.coerce(value)
        case "max_redirects":
            return check_number(name, value, minimum=0, error=error)
        case "retry":
            if not isinstance(value, RetryPolicy):
                raise ConfigurationError(f"retry must be an asyncsearch.RetryPolicy, got {value!r}")
        case "deadline":
            if value is not None:
                check_positive(name, value, also=" or None")
        case "middlewares" | "extra_middlewares":
            if isinstance(value, str | bytes) or not isinstance(value, Sequence):
                raise ConfigurationError("middlewares must be a sequence of aiohttp middlewares")
            if not all(callable(mw) for mw in value):
                raise ConfigurationError(
                    "middlewares must hold callables (async def mw(request, handler))"
                )
            if name == "middlewares":
                return tuple(value)
            return (*old.middlewares, *value)  # a call's run after (inside) the client's
        case "max_response_bytes":
            return check_number(name, value, minimum=1, error=error)
        case "first_page":
            return check_number(name, value, minimum=-math.inf, error=error)
        case "headers" | "extra_headers":
            if value is None and name == "headers":
                return {}
            return _merge_headers(name, old.headers, value, error)
        case "extra_query":
            return protocol.encode_extra_query(value)
        case "extra_body":
            return protocol.check_extra_body(value)
        case "ssl":
            if value is not None and not isinstance(value, ssl_module.SSLContext):
                raise ConfigurationError("ssl must be an ssl.SSLContext or None")
        case "trace_content":
            if value is not None and not isinstance(value, bool):
                raise ConfigurationError("trace_content must be a bool or None")
        case _:  # allow_http, tracing
            if not isinstance(value, bool):
                raise ConfigurationError(f"{name} must be a bool")
    return value


def _check_text(name: str, value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigurationError(f"{name} must be a non-empty string")
    if any(c in value for c in "\r\n\x00"):
        raise ConfigurationError(f"{name} must not contain line breaks or NUL characters")
    return value


def _merge_headers(
    name: str,
    headers: Mapping[str, str],
    changes: object,
    error: type[AsyncSearchError],
) -> dict[str, str]:
    """``headers`` with ``changes`` over them, names compared in any case.

    In ``headers`` a value of None removes a header of that name that ``headers`` has (as
    ``with_options`` does); anywhere else (a header not there to remove, as in a new client, or
    a call's ``extra_headers``, which only add) None is not a header value: ``error``.
    """
    if not isinstance(changes, Mapping):
        none = ", or None" if name == "headers" else ""
        raise error(f"{name} must be a mapping of header names to values{none}")
    replaced = {key.lower() for key in changes if isinstance(key, str)}
    if name == "headers":
        had = {key.lower() for key in headers}
        for key, value in changes.items():
            if value is None and isinstance(key, str) and key.lower() not in had:
                raise error(
                    f"headers: {key!r} is None, which removes a header, and there is no header "
                    f"{key!r} to remove"
                )
        changes = {key: value for key, value in changes.items() if value is not None}
    checked = protocol.check_extra_headers(changes, name=name, error=error)
    kept = {key: value for key, value in headers.items() if key.lower() not in replaced}
    return {**kept, **checked}


#: The default ``retry``: today's rules (made here, where its checks are defined).
DEFAULT_RETRY: Final = RetryPolicy()
