"""OpenTelemetry spans of the client's calls, made when ``opentelemetry-api`` is importable.

opentelemetry-api is never a dependency (the ``otel`` extra installs it). When it can be
imported, every call makes a span named ``asyncsearch.<method>`` from the global tracer
provider: a CLIENT span per request call (covering its retries), and for a pager, a bulk call or
a wait, an INTERNAL parent span with a child per request. Until the application sets a tracer
provider (an SDK's), no span is started: the API's own provider would hand back one that
records nothing. Such a call, and one whose span records nothing (not sampled), gets
``NO_SPAN`` and nothing more is done for it (no attribute is computed, no context attached),
and the children of a parent that records nothing are not even started.

What a span holds: the stable HTTP semantic-convention attributes (``http.request.method``,
``server.address``, ``server.port``, ``url.full`` with its query's values ``REDACTED``,
``http.response.status_code``, ``error.type``), ``asyncsearch.attempts``,
``asyncsearch.request_id``, retries as ``asyncsearch.retry`` events with their reason, and the
page number and hit count of search pages. Never a header (so never the API key), and the query
text, image, request body and URL query values only when ``trace_content`` is on.

Each call the caller made (not the requests of a pager, a bulk call or a wait: those are parts
of one call) also records its duration in the ``asyncsearch.client.operation.duration``
histogram, once an OpenTelemetry meter provider is set (the API's own provider, before one is
set, records nothing: the call is then not even timed).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

from ._version import __version__

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, Tracer

    from ._protocol import Request


class Answer(Protocol):
    """What a span reads of an answer (an ``APIResponse``)."""

    @property
    def status_code(self) -> int: ...
    @property
    def request_id(self) -> str | None: ...

    attempts: int


#: Turns ``trace_content`` on when the client is not given it: "1", "true" or "yes".
ENV_TRACE_CONTENT = "ASYNCSEARCH_TRACE_CONTENT"

#: The histogram of the calls' durations. The semantic conventions name an SDK's logical
#: operations ``{namespace}.client.operation.duration`` in seconds (``db.``, ``gen_ai.``, ``mcp.``
#: ``client.operation.duration``); a call here may span several HTTP requests (retries, pages),
#: so ``http.client.request.duration`` (one per request: aiohttp's instrumentation records it)
#: would be the wrong name.
OPERATION_DURATION = "asyncsearch.client.operation.duration"
_DURATION_DESCRIPTION = "Duration of asyncsearch calls, retries and waits included."
#: The conventions' bucket advice for ``http.client.request.duration``: a call is HTTP requests.
_DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10)
#: The conventions' stand-in for a value left out of ``url.full``.
REDACTED = "REDACTED"

_UNKNOWN: Any = object()
_tracer: Any = _UNKNOWN
_histogram: Any = None
# opentelemetry's modules, once imported (by _get_tracer, on the first call of a client).
_trace: Any = None
_context: Any = None
_metrics: Any = None
# Whether a meter provider, a tracer provider was set; once set it stays (OpenTelemetry allows
# no second one).
_metering = False
_traced = False


def _get_tracer() -> Tracer | None:
    """The package's tracer, or None without opentelemetry-api; imported on first use only."""
    global _tracer, _trace, _context, _metrics
    if _tracer is _UNKNOWN:
        try:
            from opentelemetry import context, metrics, trace
        except ImportError:
            _tracer = None
        else:
            _trace, _context, _metrics = trace, context, metrics
            # A proxy until the application sets a provider, then that provider's tracer.
            _tracer = trace.get_tracer("asyncsearch", __version__)
    return _tracer  # type: ignore[no-any-return]


def _get_histogram() -> Any:
    """The duration histogram once a meter provider is set, else None (then nothing is timed)."""
    global _metering, _histogram
    if not _metering:
        # Until the application sets one, the API hands out its own provider (a proxy, or the
        # no-op one), whose instruments record nothing: timing calls for it would be waste.
        if _api_own(_metrics.get_meter_provider()):
            return None
        _metering = True
        meter = _metrics.get_meter("asyncsearch", __version__)
        what = {"unit": "s", "description": _DURATION_DESCRIPTION}
        try:
            _histogram = meter.create_histogram(
                OPERATION_DURATION, explicit_bucket_boundaries_advisory=_DURATION_BUCKETS, **what
            )
        except TypeError:  # opentelemetry-api before 1.23 takes no bucket advice
            _histogram = meter.create_histogram(OPERATION_DURATION, **what)
    return _histogram


def _provider_set() -> bool:
    """Whether the application set a tracer provider. Until it does, the API's own provider makes
    spans that record nothing: no span is started then (measured: starting one cost a direct
    call 5-7% of its CPU)."""
    global _traced
    _traced = _traced or not _api_own(_trace.get_tracer_provider())
    return _traced


def _api_own(provider: object) -> bool:
    """True for a provider of opentelemetry-api's own (a proxy until one is set, or a no-op)."""
    return type(provider).__module__.startswith(("opentelemetry.trace", "opentelemetry.metrics"))


def error_type(error: BaseException) -> str:
    """``error.type`` as the semantic conventions give it: an HTTP error's status code, else the
    error's fully qualified class name (as a traceback prints it, but a public name by its public
    path: ``asyncsearch.NotFoundError``, not the private module that defines it)."""
    status_code = getattr(error, "status_code", None)
    if isinstance(status_code, int) and status_code >= 400:
        return str(status_code)
    cls = type(error)
    module = cls.__module__
    if module == "builtins":
        return cls.__qualname__
    public = getattr(sys.modules.get("asyncsearch"), cls.__qualname__, None)
    if module.startswith("asyncsearch._") and public is cls:
        module = "asyncsearch"
    return f"{module}.{cls.__qualname__}"


def redact_query(target: str) -> str:
    """``target`` with each query parameter's value replaced by ``REDACTED``, names kept."""
    path, mark, query = target.partition("?")
    if not mark:
        return target
    parts = (part.partition("=") for part in query.split("&") if part)
    return f"{path}?" + "&".join(name + (f"={REDACTED}" if eq else "") for name, eq, _ in parts)


class CallSpan:
    """The span of one call. This base records nothing: it is ``NO_SPAN``."""

    __slots__ = ()

    def __enter__(self) -> CallSpan:
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        return None

    @property
    def context(self) -> Context | None:
        """The context that makes a child of this span; None when it records nothing."""
        return None

    def answered(self, answer: Answer) -> None:
        """Record the answer a call returns with."""

    def retry(self, attempt: int, delay: float, reason: str) -> None:
        """Record that attempt ``attempt`` failed for ``reason`` and is retried in ``delay`` s."""

    def set(self, name: str, value: Any) -> None:
        """Set one attribute."""

    def event(self, name: str, attributes: Mapping[str, Any]) -> None:
        """Add one event."""

    def end(self, error: BaseException | None = None) -> None:
        """End the span (once; later calls do nothing), recording ``error`` if given.

        Once ended, a span is never touched again: ``answered``, ``retry``, ``set`` and
        ``event`` do nothing.
        """

    def hold(self) -> None:
        """Leave the span open when its ``with`` block exits without an error, for ``end()``.

        So what is learnt later (a page's hit count) can be set first.
        """


NO_SPAN = CallSpan()


class _Timed(CallSpan):
    """A call that records its duration in the histogram (when ``metric`` is given) and no span."""

    __slots__ = ("_end_time", "_ended", "_held", "_metric", "_started", "_stopped")

    def __init__(self, metric: dict[str, Any] | None) -> None:
        self._metric = metric
        self._started = time.perf_counter()
        self._stopped: float | None = None
        self._end_time: int | None = None  # the span's end, in ns since the epoch, when held
        self._ended = False
        self._held = False

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        if self._held and exc is None:
            self._stopped = time.perf_counter()
            self._end_time = time.time_ns()
        else:
            self.end(exc)

    def hold(self) -> None:
        self._held = True

    def end(self, error: BaseException | None = None) -> None:
        if not self._ended:
            self._ended = True
            self._finish(error)

    def _finish(self, error: BaseException | None) -> None:
        self._record(error)

    def _record(self, error: BaseException | None) -> None:
        """One value in the histogram: the call's seconds (to its ``with`` exit when held)."""
        metric = self._metric
        if metric is None:
            return
        stopped = time.perf_counter() if self._stopped is None else self._stopped
        if error is not None:
            # Cancelled too: its duration is not a completed call's, so it is told apart.
            metric = {**metric, "error.type": error_type(error)}
        _histogram.record(stopped - self._started, metric)


class _Recording(_Timed):
    __slots__ = ("_span", "_token")

    def __init__(self, span: Span, metric: dict[str, Any] | None) -> None:
        super().__init__(metric)
        self._span = span
        self._token: object = None

    def __enter__(self) -> CallSpan:
        # Current while the request runs: spans of an instrumented aiohttp nest under it.
        self._token = _context.attach(_trace.set_span_in_context(self._span))
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        if self._token is not None:
            _context.detach(self._token)
            self._token = None
        super().__exit__(exc_type, exc, tb)

    @property
    def context(self) -> Context | None:
        return _trace.set_span_in_context(self._span)  # type: ignore[no-any-return]

    def answered(self, answer: Answer) -> None:
        if not self._ended:
            _outcome(self._span, answer)

    def retry(self, attempt: int, delay: float, reason: str) -> None:
        if self._ended:
            return
        self._span.add_event(
            "asyncsearch.retry",
            {
                "asyncsearch.attempt": attempt,
                "asyncsearch.retry.reason": reason,
                "asyncsearch.retry.delay": delay,
            },
        )

    def set(self, name: str, value: Any) -> None:
        if not self._ended:
            self._span.set_attribute(name, value)

    def event(self, name: str, attributes: Mapping[str, Any]) -> None:
        if not self._ended:
            self._span.add_event(name, attributes)

    def _finish(self, error: BaseException | None) -> None:
        span = self._span
        if error is not None:
            _outcome(span, error)  # only names and numbers: a message may quote what was sent
            if isinstance(error, Exception):
                span.set_attribute("error.type", error_type(error))
                span.set_status(_trace.Status(_trace.StatusCode.ERROR, type(error).__qualname__))
            else:
                # Cancelled (or the process is exiting): the call ended, nothing failed.
                span.set_attribute("asyncsearch.cancelled", True)
        span.end(self._end_time)
        self._record(error)


#: What a span reads of an answer or an error: (attribute, the span's attribute, its type).
_OUTCOME = (
    ("attempts", "asyncsearch.attempts", int),
    ("status_code", "http.response.status_code", int),
    ("request_id", "asyncsearch.request_id", str),
)


def _outcome(span: Span, outcome: object) -> None:
    """Set the attempts, status and request id an answer or an error has (of the right type)."""
    for name, key, kind in _OUTCOME:
        value = getattr(outcome, name, None)
        if isinstance(value, kind):
            span.set_attribute(key, value)


class Tracing:
    """A client's tracing settings; ``call`` starts the span of one call."""

    __slots__ = ("_base_url", "_server", "content", "enabled")

    def __init__(self, *, base_url: str, enabled: bool, content: bool) -> None:
        self.enabled = enabled
        self.content = content
        self._base_url = base_url
        parts = urlsplit(base_url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        self._server: dict[str, str | int] = {
            "server.address": parts.hostname or "",
            "server.port": port,
        }

    def call(
        self,
        name: str,
        request: Request[Any] | None = None,
        *,
        parent: CallSpan | None = None,
        attributes: Mapping[str, Any] | None = None,
    ) -> CallSpan:
        """The span of a call named ``asyncsearch.<name>``: a CLIENT span for ``request``, an
        INTERNAL one (a pager's, a bulk call's) without; a child of ``parent`` when given.

        Without ``parent`` it is a call of the caller's: its duration goes in the histogram.
        """
        if not self.enabled:
            return NO_SPAN
        tracer = _get_tracer()
        if tracer is None:
            return NO_SPAN
        context = None
        metric = None
        if parent is not None:
            context = parent.context
            if context is None:
                return NO_SPAN  # the parent records nothing: neither would its children
        elif _get_histogram() is not None:
            metric = {"asyncsearch.operation.name": name, **self._server}
        if not _provider_set():
            return NO_SPAN if metric is None else _Timed(metric)
        kind = _trace.SpanKind.INTERNAL if request is None else _trace.SpanKind.CLIENT
        span = tracer.start_span(f"asyncsearch.{name}", context=context, kind=kind)
        if not span.is_recording():
            return NO_SPAN if metric is None else _Timed(metric)
        if request is not None:
            target = request.target if self.content else redact_query(request.target)
            span.set_attributes(
                {
                    "http.request.method": request.method,
                    "url.full": self._base_url + target,
                    **self._server,
                }
            )
            if self.content and request.body is not None:
                span.set_attribute("asyncsearch.request.body", request.body.decode())
        if attributes:
            span.set_attributes(attributes)
        return _Recording(span, metric)


class LazySpan:
    """The span of a pager, a bulk call or a wait: started with its first child, ended once.

    After ``end`` nothing more is done to it: ``set``, ``event`` and a later ``end`` do nothing
    and ``child`` gives ``NO_SPAN``.
    """

    __slots__ = ("_attributes", "_ended", "_name", "_span", "_tracing", "totals")

    def __init__(
        self, tracing: Tracing, name: str, attributes: Mapping[str, Any] | None = None
    ) -> None:
        self._tracing = tracing
        self._name = name
        self._attributes = attributes
        self._span: CallSpan | None = None
        self._ended = False
        #: Counts kept while the call runs, set as attributes when the span ends.
        self.totals: dict[str, int] = {}

    def child(
        self, name: str, request: Request[Any], attributes: Mapping[str, Any] | None = None
    ) -> CallSpan:
        """The span of one request of this call."""
        if self._ended:
            return NO_SPAN
        span = self._span
        if span is None:
            span = self._span = self._tracing.call(self._name, attributes=self._attributes)
        if span is NO_SPAN:
            return NO_SPAN  # nothing records this call: its requests' spans would not either
        return self._tracing.call(name, request, parent=span, attributes=attributes)

    def set(self, name: str, value: Any) -> None:
        if self._span is not None and not self._ended:
            self._span.set(name, value)

    def event(self, name: str, attributes: Mapping[str, Any]) -> None:
        if self._span is not None and not self._ended:
            self._span.event(name, attributes)

    def end(self, error: BaseException | None = None) -> None:
        """End the span (the first call only)."""
        if self._ended:
            return
        self._ended = True
        span = self._span
        if span is not None:
            for name, value in self.totals.items():
                span.set(name, value)
            span.end(error)
