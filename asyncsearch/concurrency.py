"""The generic machinery behind the bulk methods, for anything else.

It knows nothing of the service: ``fan_out`` calls any async function over any iterable with
bounded concurrency and yields ``Outcome`` objects (through a ``FanOut`` iterator);
``AdaptiveConcurrency`` is the controller that lowers and raises the number in flight under
429/503 pressure; ``RetryBudget`` (also exported by ``asyncsearch``) is the retry token bucket.
"""

from __future__ import annotations

from ._concurrency import AdaptiveConcurrency, FanOut, Outcome, RetryBudget, fan_out

__all__ = ["AdaptiveConcurrency", "FanOut", "Outcome", "RetryBudget", "fan_out"]
