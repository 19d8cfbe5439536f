"""Client options that are plain values: timeouts, defaults, and the "not given" sentinel."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Final, Literal

from ._errors import ConfigurationError

__all__ = [
    "DEFAULT_MAX_REDIRECTS",
    "DEFAULT_MAX_RESPONSE_BYTES",
    "DEFAULT_MAX_RETRY_AFTER",
    "DEFAULT_TIMEOUT",
    "NOT_GIVEN",
    "NO_TIMEOUT",
    "NotGiven",
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
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigurationError(
                "timeout must be a number of seconds, an asyncsearch.Timeout or None, "
                f"got {value!r}"
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
