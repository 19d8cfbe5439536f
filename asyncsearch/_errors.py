"""The exceptions asyncsearch raises; every one of them derives from ``AsyncSearchError``.

::

    AsyncSearchError                    base; ``.attempts`` once requests were made,
                                        ``.request_id`` once an answer came,
                                        ``.retries_stopped`` when retries ended early
    ├── APIConnectionError              no usable HTTP answer (refused, reset, TLS, bad framing)
    │   ├── APITimeoutError             connect, read or total timeout of an attempt, or
    │   │   │                           the call's ``deadline`` (that one not retried)
    │   │   └── PoolTimeoutError        no free pooled connection (or rate-limit token) within
    │   │                               ``Timeout.pool`` (never retried)
    │   └── ProxyError                  the proxy refused (``.status_code``); nothing was sent
    ├── APIStatusError                  the service answered with a non-2xx status
    │   ├── BadRequestError             400
    │   ├── AuthenticationError         401
    │   ├── PermissionDeniedError       403
    │   ├── NotFoundError               404
    │   ├── ConflictError               409
    │   ├── UnprocessableEntityError    422
    │   ├── RateLimitError              429 (``.retry_after``)
    │   └── InternalServerError         >= 500
    ├── ResponseValidationError         a 2xx body that does not fit (``.path``, ``.body``)
    ├── ResponseTooLargeError           a body past ``max_response_bytes``
    ├── InvalidRequestError             bad arguments, raised before sending (also ValueError)
    ├── ConfigurationError              bad client options (also ValueError)
    ├── ClientClosedError               the client was closed (also RuntimeError)
    │   └── EventLoopMismatchError      the client is used, or closed, from another event loop
    │                                   than the one of its first request
    ├── MiddlewareError                 a client middleware sent one request twice (not retried)
    ├── KeyProviderError                the ``api_key`` provider raised, in a bulk call (a direct
    │                                   call raises the provider's own error)
    └── WaitTimeoutError                ``wait_for_extraction`` ran out of time (also TimeoutError)

No message, ``str()``, ``repr()``, argument or attribute of these (nor of an error they lead to
through ``__cause__`` and ``__context__``) contains the API key or a proxy's credentials: every
error leaves the client through one boundary, where they are scrubbed (``_protocol.Secrets``).

An error raised after the service answered (a status error, a body that does not fit, a body
too large) carries the answer's ``X-Request-Id`` (or ``Request-Id``) in ``request_id`` and in
its message, to quote to the service's operators; it is ``None`` when no answer came.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict, Unpack

if TYPE_CHECKING:
    from ._models import ExtractionJob  # for the annotation of WaitTimeoutError.job only


class AsyncSearchError(Exception):
    """Base class of every error raised by asyncsearch.

    ``attempts`` is the number of the call's attempts that went out (were handed to the
    connection to send: an attempt stopped before, by the deadline, ``Timeout.pool``, the rate
    limit or the key provider, is not counted), or ``None`` when the error came before the call
    began (bad arguments, bad options, a closed client). ``request_id`` is the id the service
    gave its answer, or ``None`` when no answer came (or it gave none).
    """

    attempts: int | None
    request_id: str | None = None
    #: Why no more attempts were made although ``max_retries`` allowed more (the server asked
    #: for a longer wait than ``max_retry_after``, the client's retry budget was spent, the
    #: call's ``deadline`` would have passed, or the next attempt was stopped before it was
    #: sent), or ``None``.
    retries_stopped: str | None = None

    def __init__(self, message: str, *, attempts: int | None = None) -> None:
        """Make the error (the SDK does; a test or a wrapper may too).

        Args:
            message: What went wrong, for a person; ``str(error)`` adds the attempts, why
                retries stopped and the request id.
            attempts: The HTTP attempts made, or ``None`` when none was.
        """
        super().__init__(message)
        self.message = message
        self.attempts = attempts

    def __str__(self) -> str:
        text = self.message
        notes = []
        if self.attempts is not None and self.attempts > 1:
            notes.append(f"after {self.attempts} attempts")
        if self.retries_stopped is not None:
            notes.append(f"not retried: {self.retries_stopped}")
        if notes:
            text = f"{text} ({'; '.join(notes)})"
        if self.request_id is not None:
            text = f"{text} [request id {self.request_id}]"
        return text

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self)!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickle (multiprocessing, Ray) would remake an error as cls(*args), which fails for
        # every class with keyword-only arguments: rebuild it from its args and attributes.
        state = dict(self.__dict__)
        headers = state.get("headers")
        if headers is not None and not isinstance(headers, dict):
            state["headers"] = dict(headers.items())  # aiohttp's read-only view does not pickle
        return (_rebuild, (type(self), self.args, state))


def install_hint(extra: str) -> str:
    """How to install one of asyncsearch's extras.

    asyncsearch is not on PyPI: it installs from a checkout, so ``pip install
    'asyncsearch[extra]'`` would fail (or install someone else's package).
    """
    return f"pip install -e '.[{extra}]' in a checkout of asyncsearch"


def _rebuild(cls: type[AsyncSearchError], args: tuple[Any, ...], state: dict[str, Any]) -> Any:
    """Unpickle an error without calling its ``__init__``."""
    error = cls.__new__(cls, *args)
    error.args = args
    error.__dict__.update(state)
    return error


class APIConnectionError(AsyncSearchError):
    """No usable HTTP answer: the connection was refused, reset or cut, or TLS failed.

    ``retryable`` is False for failures that a retry cannot fix, such as a TLS certificate that
    does not verify. ``request_sent`` is False when the attempt failed before any byte of the
    request was sent (DNS, connection refused, connect timeout, TLS handshake), so the server
    cannot have acted on it; True when the request may have reached the server.
    """

    def __init__(
        self,
        message: str = "connection error",
        *,
        attempts: int | None = None,
        retryable: bool = True,
        request_sent: bool = True,
    ) -> None:
        """Make the error.

        Args:
            message: What went wrong.
            attempts: The HTTP attempts made, or ``None`` when none was.
            retryable: Whether a retry may fix it.
            request_sent: Whether the request may have reached the server.
        """
        super().__init__(message, attempts=attempts)
        self.retryable = retryable
        self.request_sent = request_sent


class ProxyError(APIConnectionError):
    """The proxy between the client and the service refused the request; nothing reached the
    service (``request_sent`` is False).

    ``status_code`` is the proxy's answer: to the ``CONNECT`` of an ``https://`` service's tunnel
    (any status), or to a plain-http request (407 only: another status cannot be told from the
    service's own). A 407 (the proxy wants other credentials) is never retried, and stops a bulk
    call the way a 401 does; another status (a 502: the proxy could not reach the service) is
    retried as a connection that failed before sending is.
    """

    def __init__(self, message: str, *, status_code: int, attempts: int | None = None) -> None:
        """Make the error (``retryable`` unless a 407; never ``request_sent``).

        Args:
            message: What the proxy refused.
            status_code: The proxy's answer.
            attempts: The attempts that went out, or ``None`` when none was counted.
        """
        refused = status_code == 407  # the proxy wants other credentials: never retried
        super().__init__(message, attempts=attempts, retryable=not refused, request_sent=False)
        self.status_code = status_code


class APITimeoutError(APIConnectionError):
    """An attempt ran past its connect, read or total timeout."""

    def __init__(
        self,
        message: str = "request timed out",
        *,
        attempts: int | None = None,
        request_sent: bool = True,
    ) -> None:
        """Make the error (always ``retryable``).

        Args:
            message: What ran out of time.
            attempts: The HTTP attempts made, or ``None`` when none was.
            request_sent: Whether the request may have reached the server.
        """
        super().__init__(message, attempts=attempts, retryable=True, request_sent=request_sent)


class PoolTimeoutError(APITimeoutError):
    """No connection of the client's pool became free within ``Timeout.pool``, or the client's
    ``RateLimit`` would have held a direct call's request longer than that.

    The request was never sent; it is never retried and costs no retry budget.
    """

    def __init__(
        self,
        message: str = "timed out waiting for a free connection",
        *,
        attempts: int | None = None,
    ) -> None:
        """Make the error (never ``retryable``, never ``request_sent``).

        Args:
            message: What ran out of time.
            attempts: The HTTP attempts made, or ``None`` when none was.
        """
        super().__init__(message, attempts=attempts, request_sent=False)
        # Not retried: the wait is the client's own congestion (more calls at once than
        # ``max_connections``), not the server's.
        self.retryable = False


class StatusErrorFields(TypedDict):
    """The keyword arguments of ``APIStatusError`` (declared once, here), for its subclasses."""

    status_code: int
    headers: Mapping[str, str]
    body: Any
    method: str
    url: str
    attempts: NotRequired[int | None]


class APIStatusError(AsyncSearchError):
    """The service answered with a status that is not a success.

    ``body`` is the decoded JSON error body when there was one, else the body's text
    (cut to a few kilobytes), else ``None``.
    """

    def __init__(self, message: str, **fields: Unpack[StatusErrorFields]) -> None:
        """Make the error of one answer (every subclass takes the same arguments).

        Args:
            message: What the service said, for a person.
            status_code: The answer's HTTP status.
            headers: The answer's headers.
            body: The decoded JSON error body, else the body's text (cut), else ``None``.
            method: The request's HTTP method.
            url: The request's URL (without the key, which is never in a URL).
            attempts: The HTTP attempts made.
        """
        super().__init__(message, attempts=fields.get("attempts"))
        self.status_code = fields["status_code"]
        self.headers = fields["headers"]
        self.body = fields["body"]
        self.method = fields["method"]
        self.url = fields["url"]


class BadRequestError(APIStatusError):
    """400: the service refused the request as malformed."""


class AuthenticationError(APIStatusError):
    """401: the API key is missing or not valid."""


class PermissionDeniedError(APIStatusError):
    """403: the key may not do this."""


class NotFoundError(APIStatusError):
    """404: the extraction job or webhook log does not exist."""


class ConflictError(APIStatusError):
    """409: the request conflicts with the current state."""


class UnprocessableEntityError(APIStatusError):
    """422: the request was well formed but its values were refused."""


class RateLimitError(APIStatusError):
    """429: too many requests.

    ``retry_after`` is the delay in seconds the service asked for, or ``None`` when it gave
    none (or gave one that could not be read).
    """

    def __init__(
        self, message: str, *, retry_after: float | None = None, **fields: Unpack[StatusErrorFields]
    ) -> None:
        """Make the error of a 429 answer.

        Args:
            message: What the service said, for a person.
            retry_after: The delay in seconds the service asked for, or ``None``.
            status_code: The answer's HTTP status.
            headers: The answer's headers.
            body: The decoded JSON error body, else the body's text (cut), else ``None``.
            method: The request's HTTP method.
            url: The request's URL.
            attempts: The HTTP attempts made.
        """
        super().__init__(message, **fields)
        self.retry_after = retry_after


class InternalServerError(APIStatusError):
    """A status of 500 or above: the service failed."""


class ResponseValidationError(AsyncSearchError):
    """A success response whose body does not fit the expected shape.

    ``path`` names where it went wrong as a JSON path (``$.hits[3].score``), or ``None`` when the
    body was not JSON at all; ``body`` keeps the raw bytes.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | None,
        body: bytes,
        attempts: int | None = None,
    ) -> None:
        """Make the error.

        Args:
            message: What did not fit, for a person.
            path: Where, as a JSON path, or ``None`` when the body was not JSON.
            body: The raw bytes of the body.
            attempts: The HTTP attempts made.
        """
        super().__init__(message, attempts=attempts)
        self.path = path
        self.body = body

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self)!r}, path={self.path!r})"


class ResponseTooLargeError(AsyncSearchError):
    """A response body (after decompression) was larger than ``max_response_bytes``."""

    def __init__(self, message: str, *, limit: int, attempts: int | None = None) -> None:
        """Make the error.

        Args:
            message: How large the body was, for a person.
            limit: The client's ``max_response_bytes``.
            attempts: The HTTP attempts made.
        """
        super().__init__(message, attempts=attempts)
        self.limit = limit


class InvalidRequestError(AsyncSearchError, ValueError):
    """An argument is not valid; raised before anything is sent. The message names it."""


class ConfigurationError(AsyncSearchError, ValueError):
    """A client option is missing or not valid."""


class ClientClosedError(AsyncSearchError, RuntimeError):
    """The client was closed, or it is used from an event loop other than its session's."""


class EventLoopMismatchError(ClientClosedError):
    """The client is used (or closed) from another event loop than the one of its first request.

    Its connections belong to that loop: create one client per event loop (for example in the
    lifespan of an app, or in the ``main()`` that ``asyncio.run`` runs), and close it from that
    loop before the loop ends. A ``ClientClosedError``, so ``except ClientClosedError`` still
    catches it.
    """


class MiddlewareError(AsyncSearchError):
    """A client middleware sent one request a second time (it called ``handler()`` again).

    The request went out once and was answered; asyncsearch sends each attempt once and makes
    its retries itself, so it is not retried. (A middleware's own exception is raised as it is.)
    """


class KeyProviderError(AsyncSearchError):
    """The ``api_key`` provider raised while a bulk call asked it for the key; its error is the
    ``__cause__``.

    The bulk call stops there, as after a 401: the ids not sent yet fail with it too, and the
    provider is not asked again. (A direct call raises the provider's own error as it is.)
    """


class WaitTimeoutError(AsyncSearchError, TimeoutError):
    """Waiting for an extraction job ran out of time; ``job`` is the last state seen."""

    def __init__(
        self, message: str, *, job: ExtractionJob | None = None, attempts: int | None = None
    ) -> None:
        """Make the error.

        Args:
            message: How long it waited and the last state seen.
            job: The last state of the job seen, or ``None`` when no poll was answered.
            attempts: The HTTP attempts made by all the polls.
        """
        super().__init__(message, attempts=attempts)
        self.job = job
