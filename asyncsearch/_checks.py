"""The checks every layer shares, written once: numeric arguments and "asyncio only"."""

from __future__ import annotations

import asyncio
import math
from typing import Any

from ._errors import AsyncSearchError, ConfigurationError, InvalidRequestError


def check_number(
    name: str,
    value: object,
    *,
    minimum: float,
    maximum: float | None = None,
    integer: bool = True,
    error: type[AsyncSearchError] = InvalidRequestError,
) -> Any:
    """``value``, an integer (a finite number unless ``integer``) from ``minimum`` to ``maximum``.

    Else ``error`` (a bool is not a number here, and NaN is below every ``minimum``).
    """
    if isinstance(value, bool) or not isinstance(value, int if integer else int | float):
        raise error(f"{name} must be {'an integer' if integer else 'a number'}, got {value!r}")
    if not value >= minimum:
        raise error(f"{name} must be at least {minimum:g}, got {value!r}")
    if maximum is not None and value > maximum:
        raise error(f"{name} must be at most {maximum:g}, got {value!r}")
    if value == math.inf:
        raise error(f"{name} must be finite, got {value!r}")
    return value


def check_positive(name: str, value: object, *, unit: str = " of seconds", also: str = "") -> Any:
    """``value`` if it is a positive finite number; else ``ConfigurationError`` saying so, with
    the ``unit`` and what else the option takes (``also``: " or None")."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
        raise ConfigurationError(
            f"{name} must be a positive finite number{unit}{also}, got {value!r}"
        )
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
