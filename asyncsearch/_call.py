"""One call: its attempts, each in ordered phases, retries with backoff and the retry budget.

The contract of one attempt. Its phases come in this order, each with one owner, and one record
(``_transport.Attempt``) says how far it got; every question about the attempt is answered from
that record, here:

1. **prepare** (``_Call._phases``): with a key provider, the key, asked before the call's first
   attempt and once more after a 401. An async provider is asked one question at a time for every
   call: a call that asks while a question is in flight takes its answer (``_Key.ask``); a bulk
   call's ids take the answer given since the bulk call began.
2. **connection** (``Transport.send``): a free connection of the pool; a direct call waits at most
   ``Timeout.pool`` (``PoolTimeoutError``), a bulk call without a limit.
3. **admit** (``_Call.admit``, called by the transport with the connection in hand, before each
   request of the attempt: a redirect followed is another request): a token of the rate limit.
   A wait that would end past the deadline, or for a direct call last longer than
   ``Timeout.pool``, is not begun.
4. **send** (aiohttp, the middlewares, and the transport's recorder inside them): the request
   goes out. From here on the attempt counts in ``attempts`` and its token is spent.
5. **read** (the transport's bounded reader): the body, at most ``max_response_bytes``.
6. **classify**: an aiohttp error becomes ours, ``request_sent`` as the record shows
   (``_transport.classify``); an answer that is not a success, its status error
   (``_Call.status_error``).

The call's ``deadline`` bounds every phase. ``_Call.run`` makes the attempts: after a failure
that may be retried it waits (``retry_delay``: the server's ``Retry-After`` or the policy's
backoff, the retry budget, and the deadline, counting the rate limit's wait) and begins another.
An attempt stopped before phase 4 sent nothing: it is not counted, its token is given back, and
the call ends with its last real error, ``retries_stopped`` saying why, or, when nothing was sent
at all, with the error that stopped it (an ``APITimeoutError`` saying nothing was sent). Every
error leaves the call through ``send``, where ``Secrets.scrub`` takes the key and the proxy's
credentials out of it. ``APIResponse`` is the answer.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast
from urllib.parse import urlsplit

import anyio

from . import _models as models
from . import _protocol as protocol
from ._concurrency import AdaptiveConcurrency, RateLimit, RetryBudget
from ._config import Options, _Key
from ._errors import (
    APIConnectionError,
    APITimeoutError,
    AsyncSearchError,
    KeyProviderError,
    PoolTimeoutError,
    ProxyError,
    ResponseValidationError,
)
from ._protocol import Request, Response, Secrets
from ._tracing import NO_SPAN
from ._transport import Attempt, Transport

if TYPE_CHECKING:
    from ._tracing import CallSpan

T = TypeVar("T")

logger = logging.getLogger("asyncsearch")

# Looked up at call time, so tests can record backoff delays instead of sleeping them.
_sleep = anyio.sleep

#: What an attempt stopped before sending was waiting for, by its phase (PREPARE, CONNECTION,
#: ADMIT: 1, 2, 3).
_WAITING = (
    "the api_key provider's answer",
    "a connection of the pool",
    "its token of the rate limit",
)


@dataclass(slots=True)
class Shared:
    """What a client and the clients made by ``with_options`` share: the pool, the retry budget
    and the rate limit."""

    transport: Transport
    retry_budget: RetryBudget | None
    rate_limit: RateLimit | None
    random: random.Random = field(default_factory=random.Random)


class APIResponse(Generic[T]):
    """A success response with its metadata; ``parse()`` gives the typed model.

    ``status_code``, ``headers`` (case-insensitive), ``elapsed`` (seconds of the last attempt),
    ``attempts`` (how many went out), ``url``, ``content`` (the raw body) and ``request_id``
    (the answer's ``X-Request-Id`` or ``Request-Id``). The model ``parse()`` gives carries the
    same ``request_id`` (a ``SearchPage``, ``ExtractionJob``, ``WebhookLog`` or ``LinkPreview``;
    not the list of ``list_webhook_logs``), so a plain call needs no ``with_raw_response`` for it.
    """

    __slots__ = ("_parsed", "_request", "_response", "_secrets", "attempts")
    # Made by the client only (_api_response): no constructor of its own in help().
    _request: Request[T]
    _response: Response
    _parsed: tuple[T] | None
    _secrets: Secrets
    attempts: int

    @property
    def status_code(self) -> int:
        return self._response.status

    @property
    def headers(self) -> Mapping[str, str]:
        # Scrubbed here, where they leave the client, not for every answer of a bulk fetch.
        return cast("Mapping[str, str]", self._secrets.scrubbed(self._response.headers))

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
        # Read from the headers as received, only the id scrubbed: parse() reads it for every
        # answer of a bulk call, which never looks at the other headers.
        found = protocol.request_id(self._response.headers)
        return found if found is None else self._secrets.redact(found)

    def parse(self) -> T:
        """Decode the body (once; later calls return the same object).

        Raises:
            ResponseValidationError: the body does not fit the model.
        """
        if self._parsed is None:
            try:
                parsed = self._request.parse(self._response.body)
                models.set_request_id(parsed, self.request_id)
                self._parsed = (parsed,)
            except ResponseValidationError as exc:
                exc.attempts = self.attempts
                exc.request_id = self.request_id
                content_type = self._response.headers.get("Content-Type")
                protocol.explain_not_json(
                    exc,
                    status=self.status_code,
                    content_type=content_type,
                    url=self.url,
                    secrets=self._secrets,
                )
                # A server (or a proxy's debug page) may echo the request's headers.
                self._secrets.scrub(exc)
                raise
        return self._parsed[0]

    def __repr__(self) -> str:
        return (
            f"<APIResponse [{self.status_code}] {self._request.method} "
            f"{urlsplit(self.url).path} attempts={self.attempts}>"
        )


async def send(
    shared: Shared,
    options: Options,
    request: Request[T],
    span: CallSpan = NO_SPAN,
    pressure: AdaptiveConcurrency | None = None,
    asked: int | None = None,
) -> APIResponse[T]:
    """Send a request with retries; return the success response or raise its error.

    Args:
        shared: the pool, the retry budget and the rate limit.
        options: the call's (its extras already applied to ``request``); ``options.deadline``
            bounds all of it (see the module's docstring).
        request: what to send.
        span: gets the retries.
        pressure: a bulk call's limit, told about successes and overload answers (429, 503,
            with their ``Retry-After``), so that the bulk call slows down as a whole.
        asked: a bulk call's: the number of the key provider's answer when it began; an answer
            given since is this request's key, not asked again (``_Key.ask``).

    Raises:
        AsyncSearchError: the call's error, its secrets scrubbed. A key provider's own error is
            raised as it is in a direct call, as ``KeyProviderError`` in a bulk call.
    """
    end = None if options.deadline is None else anyio.current_time() + options.deadline
    call = _Call(shared, options, request, pressure, end, options.api_key, asked=asked)
    try:
        return await call.run(span)
    except Exception as exc:  # the one boundary an error of a call leaves through
        call.options.secrets.scrub(exc)
        raise


@dataclass(slots=True)
class _Call(Generic[T]):
    """One call under way: its attempts so far, and what its steps share."""

    shared: Shared
    options: Options
    request: Request[T]
    pressure: AdaptiveConcurrency | None
    end: float | None  # the call's deadline, in anyio's clock
    source: _Key  # the client's key, or its key provider
    attempts: int = 0  # attempts that went out (reached phase 4)
    last: AsyncSearchError | None = None  # the error of the last attempt that went out
    asked: int | None = None  # with a key provider: the number of its answer this call sends
    rekey: bool = True  # with a key provider: the next attempt asks it for the key
    rekeyed: bool = False  # a 401 made the call ask for the key again (once per call)

    async def run(self, span: CallSpan) -> APIResponse[T]:
        """Make attempts until one is answered with success, or none may follow."""
        policy = self.options.retry
        # May the request be sent again once it may have reached the service? See retry_search.
        idempotent = self.request.idempotent or policy.retry_search == "always"
        while True:
            record = Attempt()
            retry_after = None
            try:
                response = await self.attempt(record)
            except APIConnectionError as exc:
                if not record.went_out and isinstance(exc, APITimeoutError) and self.last:
                    # Stopped before it was sent (the deadline, Timeout.pool, the rate limit):
                    # the last real error says what happened (else this one, never retried).
                    raise self.stop(self.last, exc.message) from None
                if not protocol.is_retryable_connection_error(exc, idempotent=idempotent):
                    raise
                error: AsyncSearchError = exc
                reason = type(exc).__name__
            else:
                status = response.status
                if 200 <= status < 300:
                    if self.shared.retry_budget is not None:
                        self.shared.retry_budget.on_success()
                    if self.pressure is not None:
                        self.pressure.on_success()
                    return self.answer(response)
                error, retry_after = self.status_error(response)
                if status == 401 and self.source.provider and not self.rekeyed:
                    self.rekeyed = self.rekey = True  # the next attempt asks for the key again
                    self.last = error
                    logger.info("%s: the key was refused (401); asking again", self.request.path)
                    span.retry(self.attempts, 0.0, "status 401: the key asked again")
                    continue
                if status == 407 or not protocol.is_retryable_status(
                    status, idempotent=idempotent, statuses=policy.statuses
                ):
                    raise error
                reason = f"status {status}"
            self.last = error
            delay = self.retry_delay(error, retry_after)
            logger.info(
                "retrying %s %s in %.2fs (attempt %d of %d failed: %s)",
                self.request.method,
                self.request.path,
                delay,
                self.attempts,
                policy.max_retries + 1,
                reason,
            )
            span.retry(self.attempts, delay, reason)
            await _sleep(delay)  # holding nothing: a connection is taken inside each attempt

    def answer(self, response: Response) -> APIResponse[T]:
        answer: APIResponse[T] = APIResponse.__new__(APIResponse)
        answer._request, answer._response, answer._parsed = self.request, response, None
        answer._secrets, answer.attempts = self.options.secrets, self.attempts
        return answer

    async def attempt(self, record: Attempt) -> Response:
        """One attempt, its phases in order: the answer, whatever its status.

        Past ``end`` it is cancelled: ``APITimeoutError``. An error carries ``attempts``.
        """
        started = time.monotonic()
        try:
            if self.end is None:
                response = await self._phases(record)
            else:
                with anyio.CancelScope(deadline=self.end) as scope:
                    response = await self._phases(record)
                if scope.cancelled_caught:
                    raise self.past_deadline(record)
        except BaseException as exc:
            self.ended(record)
            if isinstance(exc, AsyncSearchError):
                exc.attempts = self.attempts
                if record.went_out and isinstance(exc, APIConnectionError):
                    elapsed = time.monotonic() - started
                    _log_attempt(self.request, type(exc).__name__, self.attempts, elapsed)
            raise
        self.ended(record)
        if logger.isEnabledFor(logging.DEBUG):
            _log_attempt(self.request, response.status, self.attempts, response.elapsed)
        return response

    async def _phases(self, record: Attempt) -> Response:
        """The phases of an attempt: 1 (the key of a key provider, asked once per key, not per
        attempt) here, the others in the transport."""
        if self.source.provider is not None and self.rekey:
            self.rekey = False
            try:
                key, self.asked = await self.source.ask(self.asked)
            except Exception as exc:
                if self.pressure is None:
                    raise  # a direct call raises the provider's error as it is
                what = f"the api_key provider raised {type(exc).__name__}: {exc}"
                raise KeyProviderError(what) from exc
            self.options = self.options.keyed(key)
        admit = None if self.shared.rate_limit is None else self.admit
        bulk = self.pressure is not None
        return await self.shared.transport.send(
            self.request, self.options, record, bulk=bulk, admit=admit
        )

    async def admit(self, record: Attempt) -> None:
        """Phase 3: the token of the rate limit of the ``record``'s next request, its connection
        in hand.

        A wait that would end past the deadline, or (the first request of a direct call) last
        longer than ``Timeout.pool``, is not begun; a wait cancelled takes no token.
        """
        limit = self.shared.rate_limit
        assert limit is not None
        if wait := limit.wait():
            if self.end is not None and anyio.current_time() + wait > self.end:
                raise self.past_deadline(record, wait)
            first = self.pressure is None and not record.went_out  # a direct call's, not a redirect
            if first and self.options.timeout.pool is not None and wait > self.options.timeout.pool:
                raise PoolTimeoutError(
                    f"{limit!r} would hold the request {wait:.2f}s, longer than Timeout.pool="
                    f"{self.options.timeout.pool:g}s; the request was not sent"
                )
        await limit.take()

    def ended(self, record: Attempt) -> None:
        """Count the attempt if it went out; give back a token taken for a request not sent."""
        self.attempts += record.went_out  # counted once it went out
        if record.admitted > record.sent and self.shared.rate_limit is not None:
            self.shared.rate_limit.give_back(record.admitted - record.sent)

    def past_deadline(self, record: Attempt, wait: float | None = None) -> APITimeoutError:
        """The deadline's error: it cut what ``record`` shows, or a token's ``wait`` passes it."""
        went = record.went_out
        which = "a redirect" if went else "the next attempt" if self.last else "the request"
        if wait is not None:
            what = f"would pass in the {wait:.2f}s {which} waits for {self.shared.rate_limit!r}"
        elif went:
            what = f"passed during attempt {self.attempts + 1}"
        else:
            what = f"passed while {which} waited for {_WAITING[record.phase - 1]}"
        unsent = "" if went or self.last else ": it was not sent"
        deadline = f"the call's deadline of {self.options.deadline:g}s"
        exc = APITimeoutError(f"{deadline} {what}{unsent}", request_sent=record.sent > 0)
        exc.retryable = False  # the deadline has passed, or will: no attempt may follow
        return exc

    def status_error(self, response: Response) -> tuple[AsyncSearchError, float | None]:
        """The error of an answer that is not a success, and its ``Retry-After`` in seconds.

        ``pressure`` is told of an overload (429, 503) and paused for a ``Retry-After`` it may wait.
        A 407 is the proxy's (only a proxy asks for its own credentials): a ``ProxyError``.
        """
        retry_after = protocol.parse_retry_after(response.headers)
        pressure = self.pressure
        if pressure is not None and response.status in (429, 503):
            pressure.on_overload()
            if retry_after is not None and retry_after <= self.options.retry.max_retry_after:
                # The service asked everyone to wait, not only this call.
                pressure.pause(retry_after)
        if response.status == 407:
            message = "the proxy refused the request: 407 Proxy Authentication Required"
            return ProxyError(message, status_code=407, attempts=self.attempts), None
        error = protocol.status_error(
            response,
            method=self.request.method,
            attempts=self.attempts,
            retry_after=retry_after,
            reason=_redirect_reason(response),
        )
        return error, retry_after

    def retry_delay(self, error: AsyncSearchError, retry_after: float | None) -> float:
        """How long to wait before the next attempt after ``error``; raises it if none may follow.

        The server's ``Retry-After`` is honoured up to ``max_retry_after``; past it the error is
        raised at once. ``max_retries`` and the retry budget come next; the delay is otherwise the
        policy's backoff. A wait that would end past ``end`` (the deadline), counting the rate
        limit's wait after it, is not started. The budget and the deadline say on the error that
        they stopped the retries.
        """
        policy = self.options.retry
        if self.attempts - self.rekeyed > policy.max_retries:  # the new key's attempt is free
            raise error
        delay = retry_after
        if delay is not None and delay > policy.max_retry_after:
            raise self.stop(
                error,
                f"the server asked to wait {delay:.1f}s, more than max_retry_after="
                f"{policy.max_retry_after:g}s",
            )
        if delay is None:
            draw = self.shared.random.random if policy.jitter else lambda: 1.0
            delay = protocol.backoff_delay(
                self.attempts, base=policy.base, cap=policy.cap, random=draw
            )
        if self.end is not None:
            limit = self.shared.rate_limit
            held = 0.0 if limit is None else limit.wait(delay)
            if anyio.current_time() + delay + held >= self.end:
                waits = f"{delay:.2f}s" + (f" and {held:.2f}s for {limit!r}" if held else "")
                raise self.stop(
                    error,
                    f"the call's deadline of {self.options.deadline:g}s would pass before the "
                    f"next attempt (after a wait of {waits})",
                )
        budget = self.shared.retry_budget
        if budget is None or budget.try_acquire(after_timeout=isinstance(error, APITimeoutError)):
            return delay
        raise self.stop(
            error,
            f"the client's retry budget is spent ({self.attempts - 1} of max_retries="
            f"{policy.max_retries} retries made; see RetryBudget)",
        )

    def stop(self, error: AsyncSearchError, why: str) -> AsyncSearchError:
        """``error``, saying why no attempt follows it although ``max_retries`` allowed one."""
        error.retries_stopped = why
        logger.info("%s %s: not retrying: %s", self.request.method, self.request.path, why)
        return error


def _log_attempt(request: Request[Any], outcome: object, attempts: int, elapsed: float) -> None:
    logger.debug(
        "%s %s -> %s (attempt %d, %.3fs)", request.method, request.path, outcome, attempts, elapsed
    )


def _redirect_reason(response: Response) -> str | None:
    if not 300 <= response.status < 400:
        return None
    if response.headers.get("Location") is None:
        return "a redirect without a Location header"
    return (
        "a redirect to another origin was not followed: only same-origin redirects are "
        "followed, so the API key is never sent anywhere else"
    )
