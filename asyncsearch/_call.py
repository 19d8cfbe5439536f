"""One call: its attempts, retries with backoff and the retry budget, and the answer.

``send`` is the request loop every endpoint, pager and bulk helper goes through, in small
layers (as httpx's ``send`` -> ``_send_handling_auth`` -> ...): ``send`` runs the attempts and
sleeps between them; its ``_Call`` (what the steps of one call share) makes one (``attempt``),
turns an answer that is not a success into its error (``status_error``), and decides whether
(and after how long) another attempt follows (``retry_delay``: by the call's ``RetryPolicy``,
the pool's retry budget and the call's ``deadline``). The call's span gets the retries;
``APIResponse`` is the answer.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar
from urllib.parse import urlsplit

import anyio
import msgspec

from . import _models as models
from . import _protocol as protocol
from ._concurrency import AdaptiveConcurrency, RateLimit, RetryBudget
from ._config import Options, _Secret
from ._errors import (
    APIConnectionError,
    APIStatusError,
    APITimeoutError,
    AsyncSearchError,
    ResponseValidationError,
)
from ._protocol import Request, Response
from ._tracing import NO_SPAN
from ._transport import Transport, scrub_headers

if TYPE_CHECKING:
    from ._tracing import CallSpan

T = TypeVar("T")

logger = logging.getLogger("asyncsearch")

# Looked up at call time, so tests can record backoff delays instead of sleeping them.
_sleep = anyio.sleep


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
    ``attempts`` (how many were made), ``url``, ``content`` (the raw body) and ``request_id``
    (the answer's ``X-Request-Id`` or ``Request-Id``). The model ``parse()`` gives carries the
    same ``request_id`` (a ``SearchPage``, ``ExtractionJob``, ``WebhookLog`` or ``LinkPreview``;
    not the list of ``list_webhook_logs``), so a plain call needs no ``with_raw_response`` for it.
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
        # Read from the headers as received, only the id scrubbed: parse() reads it for every
        # answer of a bulk call, which never looks at the other headers.
        found = protocol.request_id(self._response.headers)
        return found if found is None else protocol.redact(found, self._secret)

    def parse(self) -> T:
        """Decode the body (once; later calls return the same object).

        Raises ``ResponseValidationError`` when the body does not fit the model.
        """
        if self._parsed is None:
            try:
                parsed = self._request.parse(self._response.body)
                models.set_request_id(parsed, self.request_id)
                self._parsed = (parsed,)
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


def _api_response(call: _Call[T], response: Response) -> APIResponse[T]:
    answer: APIResponse[T] = APIResponse.__new__(APIResponse)
    answer._request = call.request
    answer._response = response
    answer._parsed = None
    answer._secret = call.options.api_key.get()
    answer.attempts = call.attempts
    return answer


async def send(
    shared: Shared,
    options: Options,
    request: Request[T],
    span: CallSpan = NO_SPAN,
    pressure: AdaptiveConcurrency | None = None,
) -> APIResponse[T]:
    """Send a request with retries; return the success response or raise its error.

    ``options`` are the call's (its extras already applied to ``request``). ``pressure`` is
    told about successes and overload answers (429, 503, with their ``Retry-After``), so that a
    bulk fetch can slow down as a whole; ``span`` gets the retries. ``options.deadline``
    bounds all of it: an attempt it cuts short raises ``APITimeoutError``, and a retry whose
    wait would end past it is not started. With a key provider (``api_key=`` a function), a 401
    asks it again once and makes one more attempt, counted by no retry limit.
    """
    policy = options.retry
    # May the request be sent again once it may have reached the service? See retry_search.
    idempotent = request.idempotent or policy.retry_search == "always"
    end = None if options.deadline is None else anyio.current_time() + options.deadline
    call = _Call(shared, options, request, pressure, end, options.api_key)
    while True:
        call.attempts += 1
        retry_after = None
        try:
            response = await call.attempt()
        except APIConnectionError as exc:
            if not protocol.is_retryable_connection_error(exc, idempotent=idempotent):
                raise
            error: AsyncSearchError = exc
            reason = type(exc).__name__
        else:
            status = response.status
            if 200 <= status < 300:
                if shared.retry_budget is not None:
                    shared.retry_budget.on_success()
                if pressure is not None:
                    pressure.on_success()
                return _api_response(call, response)
            error, retry_after = call.status_error(response)
            if status == 401 and call.source.provider and not call.rekeyed:
                call.rekeyed = call.rekey = True  # the next attempt asks for the key again
                logger.info("%s: the key was refused (401); asking for it again", request.path)
                span.retry(call.attempts, 0.0, "status 401: the key asked again")
                continue
            if not protocol.is_retryable_status(
                status, idempotent=idempotent, statuses=policy.statuses
            ):
                raise error
            reason = f"status {status}"
        delay = call.retry_delay(error, retry_after)
        logger.info(
            "retrying %s %s in %.2fs (attempt %d of %d failed: %s)",
            request.method,
            request.path,
            delay,
            call.attempts,
            policy.max_retries + 1,
            reason,
        )
        span.retry(call.attempts, delay, reason)
        await _sleep(delay)  # holding nothing: a connection is taken inside each attempt


@dataclass(slots=True)
class _Call(Generic[T]):
    """One call under way: what ``send``'s steps share, and the attempts made so far."""

    shared: Shared
    options: Options
    request: Request[T]
    pressure: AdaptiveConcurrency | None
    end: float | None  # the call's deadline, in anyio's clock
    source: _Secret  # the client's key, or its key provider
    attempts: int = 0
    asked: int | None = None  # with a key provider: the number of its answer this call sends
    rekey: bool = True  # with a key provider: the next attempt asks it for the key
    rekeyed: bool = False  # a 401 made the call ask for the key again (once per call)

    async def attempt(self) -> Response:
        """One attempt: the answer, whatever its status; an error carries ``attempts``.

        Past ``end`` it is cancelled: ``APITimeoutError``.
        """
        request = self.request
        started = time.monotonic()
        try:
            sending = self._send()
            if self.end is None:
                response = await sending
            else:
                with anyio.CancelScope(deadline=self.end) as scope:
                    response = await sending
                if scope.cancelled_caught:
                    raise self._past_deadline(f"passed during attempt {self.attempts}")
        except AsyncSearchError as exc:
            exc.attempts = self.attempts
            if isinstance(exc, APIConnectionError):
                _log_attempt(request, type(exc).__name__, self.attempts, time.monotonic() - started)
            raise
        if logger.isEnabledFor(logging.DEBUG):
            _log_attempt(request, response.status, self.attempts, response.elapsed)
        return response

    async def _send(self) -> Response:
        """The attempt's token of the rate limit, then the call's key, then the attempt.

        A bulk call's attempt waits for a connection without Timeout.pool; the deadline's scope
        bounds that wait as it bounds the rest of the attempt.
        """
        limit = self.shared.rate_limit
        if limit is not None:  # taken before the pool's connection: a wait here holds none
            wait = limit.wait()
            if wait and self.end is not None and anyio.current_time() + wait > self.end:
                what = f"would pass in the {wait:.2f}s attempt {self.attempts} waits for {limit!r}"
                raise self._past_deadline(what + ": it was not sent")
            await limit.take()
        if self.source.provider is not None and self.rekey:
            self.rekey = False
            key, self.asked = await self.source.ask(self.asked)
            self.options = self.options.keyed(key)  # once per key, not per attempt
        bulk = self.pressure is not None
        return await self.shared.transport.send(self.request, self.options, bulk=bulk)

    def _past_deadline(self, what: str) -> APITimeoutError:
        exc = APITimeoutError(f"the call's deadline of {self.options.deadline:g}s {what}")
        exc.retryable = False  # the deadline has passed, or will: no attempt may follow
        return exc

    def status_error(self, response: Response) -> tuple[APIStatusError, float | None]:
        """The error of an answer that is not a success, and its ``Retry-After`` in seconds.

        ``pressure`` is told of an overload (429, 503) and paused for a ``Retry-After`` it may wait.
        """
        secret = self.options.api_key.get()
        # The error keeps the headers: without the key, should the server have echoed it.
        headers = scrub_headers(response.headers, secret)
        response = msgspec.structs.replace(response, headers=headers)
        retry_after = protocol.parse_retry_after(headers)
        pressure = self.pressure
        if pressure is not None and response.status in (429, 503):
            pressure.on_overload()
            if retry_after is not None and retry_after <= self.options.retry.max_retry_after:
                # The service asked everyone to wait, not only this call.
                pressure.pause(retry_after)
        error = protocol.status_error(
            response,
            method=self.request.method,
            attempts=self.attempts,
            secret=secret,
            retry_after=retry_after,
            reason=_redirect_reason(response),
        )
        return error, retry_after

    def retry_delay(self, error: AsyncSearchError, retry_after: float | None) -> float:
        """How long to wait before the next attempt after ``error``; raises it if none may follow.

        The server's ``Retry-After`` is honoured up to ``max_retry_after``; past it the error is
        raised at once. ``max_retries`` and the retry budget come next; the delay is otherwise the
        policy's backoff. A wait that would end past ``end`` (the deadline) is not started. The
        budget and the deadline say on the error that they stopped the retries.
        """
        policy = self.options.retry
        if self.attempts - self.rekeyed > policy.max_retries:  # the new key's attempt is free
            raise error
        delay = retry_after
        if delay is not None and delay > policy.max_retry_after:
            stopped = (
                f"the server asked to wait {delay:.1f}s, more than max_retry_after="
                f"{policy.max_retry_after:g}s"
            )
        else:
            if delay is None:
                draw = self.shared.random.random if policy.jitter else lambda: 1.0
                delay = protocol.backoff_delay(
                    self.attempts, base=policy.base, cap=policy.cap, random=draw
                )
            budget = self.shared.retry_budget
            if self.end is not None and anyio.current_time() + delay >= self.end:
                stopped = (
                    f"the call's deadline of {self.options.deadline:g}s would pass before the "
                    f"next attempt (after a wait of {delay:.2f}s)"
                )
            elif budget is None or budget.try_acquire(
                after_timeout=isinstance(error, APITimeoutError)
            ):
                return delay
            else:
                stopped = (
                    f"the client's retry budget is spent ({self.attempts - 1} of max_retries="
                    f"{policy.max_retries} retries made; see RetryBudget)"
                )
        error.retries_stopped = stopped
        logger.info("%s %s: not retrying: %s", self.request.method, self.request.path, stopped)
        raise error


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
