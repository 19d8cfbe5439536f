"""Client options that are plain values: timeouts, defaults, and the "not given" sentinel."""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, TypedDict

from ._errors import ConfigurationError

__all__ = [
    "DEFAULT_MAX_REDIRECTS",
    "DEFAULT_MAX_RESPONSE_BYTES",
    "DEFAULT_MAX_RETRY_AFTER",
    "DEFAULT_TIMEOUT",
    "NOT_GIVEN",
    "NO_TIMEOUT",
    "NotGiven",
    "RequestOptions",
    "SearchOptions",
    "Timeout",
]


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
    """

    connect: float | None = 10.0
    read: float | None = 60.0
    total: float | None = 180.0
    pool: float | None = 180.0

    def __post_init__(self) -> None:
        for name in ("connect", "read", "total", "pool"):
            value = getattr(self, name)
            if value is None:
                continue
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or value <= 0
            ):
                raise ConfigurationError(
                    f"Timeout.{name} must be a positive finite number of seconds or None, "
                    f"got {value!r}"
                )

    @classmethod
    def coerce(cls, value: Timeout | float | NotGiven | None) -> Timeout:
        """Turn the ``timeout`` option into a ``Timeout``.

        Not given: the default. ``None``: no limit at all (as in httpx). A number: the total per
        attempt, with the other limits capped by it.
        """
        if isinstance(value, NotGiven):
            return DEFAULT_TIMEOUT
        if value is None:
            return NO_TIMEOUT
        if isinstance(value, Timeout):
            return value
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or value <= 0
        ):
            # Checked here, so that the message names what was passed, not the limit of
            # Timeout that the number would have become.
            raise ConfigurationError(
                "timeout must be a positive finite number of seconds, an asyncsearch.Timeout "
                f"or None, got {value!r}"
            )
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


class RequestOptions(TypedDict, total=False):
    """Options of one call, taken as keywords by every endpoint method, pager and bulk helper.

    Every one is optional; one not given keeps the client's value. A pager or bulk helper
    applies them to each of its requests.

    - ``timeout``: this call's ``Timeout`` per attempt, as the client option takes it (a
      ``Timeout``, a number of seconds for the total, or ``None`` for no limit).
    - ``max_retries``: this call's retries after the first attempt.
    - ``extra_headers``: headers added to the client's; they cannot replace ``X-Api-Key`` or
      ``X-Service-Base-Id`` (``InvalidRequestError``).
    - ``extra_query``: query parameters added to the URL; one the SDK sends is replaced.
    """

    timeout: Timeout | float | None
    max_retries: int
    extra_headers: Mapping[str, str]
    extra_query: Mapping[str, str | int | float | bool]


class SearchOptions(RequestOptions, total=False):
    """The options of a search call: ``RequestOptions`` and ``extra_body``.

    - ``extra_body``: fields merged into the JSON body (a field the SDK sends is replaced), for
      fields the service may take that the spec does not show.
    """

    extra_body: Mapping[str, Any]
