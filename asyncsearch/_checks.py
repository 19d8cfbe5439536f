"""The checks every layer shares, written once: integer arguments and "asyncio only"."""

from __future__ import annotations

import asyncio
from typing import TypeGuard

from ._errors import AsyncSearchError, ConfigurationError, InvalidRequestError


def is_int(value: object) -> TypeGuard[int]:
    """True for an ``int`` that is not a ``bool``."""
    return isinstance(value, int) and not isinstance(value, bool)


def check_int(
    name: str,
    value: object,
    *,
    minimum: int,
    maximum: int | None = None,
    error: type[AsyncSearchError] = InvalidRequestError,
) -> int:
    """Return ``value``, an integer from ``minimum`` to ``maximum``, or raise ``error``."""
    if not is_int(value):
        raise error(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise error(f"{name} must be at least {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise error(f"{name} must be at most {maximum}, got {value}")
    return value


def running_loop() -> asyncio.AbstractEventLoop:
    """The running asyncio loop, or ``ConfigurationError`` (under trio, or with no loop)."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        raise ConfigurationError(
            "asyncsearch runs on asyncio only, and no asyncio event loop is running here; under "
            "anyio use anyio.run(..., backend='asyncio'); trio is not supported"
        ) from None
