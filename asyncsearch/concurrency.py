"""The generic machinery behind the bulk methods, for anything else.

It knows nothing of the service: ``fan_out`` calls any async function over any iterable with
bounded concurrency and yields ``Outcome`` objects (through a ``FanOut`` iterator);
``RetryBudget`` (also exported by ``asyncsearch``) is the retry token bucket.
"""

from __future__ import annotations

from ._concurrency import FanOut, Outcome, RetryBudget, fan_out

__all__ = ["FanOut", "Outcome", "RetryBudget", "fan_out"]
