"""Fault injection: added latency, error statuses, cut connections and damaged bodies.

Settings are kept per endpoint ("search", "extract", "link", "webhook_logs", "webhook_log")
and for "*" (all of them); an endpoint's own settings override the "*" ones field by field.
Rates are probabilities drawn from one seeded RNG per emulator (one draw per request), so a run
is reproducible; scripts are exact: each request takes the next scripted action. A gate
(``hold``/``release``) parks requests until the test lets them go, so a test can keep "the other
side still running" for exactly as long as it needs, without betting on latency.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import random
from collections import Counter, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "ENDPOINTS",
    "SCRIPT_ACTIONS",
    "FaultConfig",
    "FaultDecision",
    "Faults",
    "check_endpoint",
]

ENDPOINTS = ("search", "extract", "link", "webhook_logs", "webhook_log")

Action = Literal["pass", "status", "drop", "truncate", "slow"]
# Named actions a script may hold besides HTTP status codes, and the action each decides.
_SCRIPT_DECISIONS: dict[str, Action] = {
    "ok": "pass",
    "drop": "drop",
    "truncate": "truncate",
    "slow": "slow",
}
SCRIPT_ACTIONS = tuple(_SCRIPT_DECISIONS)

# Each rate, in the order of the single draw, and the scripted action it stands for.
_RATE_ACTIONS: dict[str, int | str] = {
    "drop_connection": "drop",
    "rate_429": 429,
    "rate_500": 500,
    "rate_503": 503,
    "truncate_body": "truncate",
    "slow_body": "slow",
}


@dataclass(frozen=True, slots=True)
class FaultConfig:
    """The effective fault settings of one endpoint.

    ``latency`` seconds are waited before every answer. The rates are probabilities of, in this
    order of the single draw: a dropped connection (closed with no answer), a 429 (with
    ``Retry-After: retry_after`` unless it is None), a 500, a 503, a truncated body (the
    Content-Length promises more than is sent, then the connection closes) and a slow body
    (written in ``slow_chunks`` equal pieces, ``slow_chunk_delay`` seconds apart, so it takes
    about ``(slow_chunks - 1) * slow_chunk_delay`` seconds whatever its size).

    Args:
        latency: Seconds waited before every answer.
        rate_429: The probability of a 429 answer.
        rate_500: The probability of a 500 answer.
        rate_503: The probability of a 503 answer.
        drop_connection: The probability of a connection closed with no answer.
        truncate_body: The probability of a body cut short.
        slow_body: The probability of a body written slowly.
        retry_after: The ``Retry-After`` of a 429 (seconds, or a header value), or ``None``.
        slow_chunks: The pieces of a slow body.
        slow_chunk_delay: Seconds between the pieces of a slow body.
    """

    latency: float = 0.0
    rate_429: float = 0.0
    retry_after: float | str | None = 1
    rate_500: float = 0.0
    rate_503: float = 0.0
    drop_connection: float = 0.0
    truncate_body: float = 0.0
    slow_body: float = 0.0
    slow_chunks: int = 10
    slow_chunk_delay: float = 0.05


_FIELDS = {f.name for f in dataclasses.fields(FaultConfig)}


@dataclass(frozen=True, slots=True)
class FaultDecision:
    """What to do with one request.

    Args:
        latency: Seconds to wait before answering.
        action: ``"pass"``, ``"status"``, ``"drop"``, ``"truncate"`` or ``"slow"``.
        status: The status to answer with, for ``"status"``.
        retry_after: The ``Retry-After`` header of the answer, or ``None``.
        slow_chunks: The pieces of a slow body.
        slow_chunk_delay: Seconds between the pieces of a slow body.
    """

    latency: float
    action: Action
    status: int = 200
    retry_after: str | None = None
    slow_chunks: int = 10
    slow_chunk_delay: float = 0.05


def _check_value(name: str, value: Any) -> Any:
    if name not in _FIELDS:
        raise ValueError(f"unknown fault setting {name!r}; known: {sorted(_FIELDS)}")
    if name == "retry_after":
        if value is None or isinstance(value, str):
            return value
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise ValueError("retry_after must be a non-negative number, a string or None")
        return value
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name} must be a number")
    if name == "slow_chunks":
        if not isinstance(value, int) or value < 1:
            raise ValueError("slow_chunks must be a positive integer")
        return value
    if name in _RATE_ACTIONS and not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be a probability between 0 and 1")
    if value < 0:
        raise ValueError(f"{name} must not be negative")
    return float(value)


def check_endpoint(endpoint: str) -> str:
    if endpoint != "*" and endpoint not in ENDPOINTS:
        raise ValueError(f"unknown endpoint {endpoint!r}; known: '*', {', '.join(ENDPOINTS)}")
    return endpoint


def _check_action(action: Any) -> int | str:
    if isinstance(action, bool):
        raise ValueError(f"bad script action {action!r}")
    if isinstance(action, int):
        if not 100 <= action <= 599:
            raise ValueError(f"a scripted status must be between 100 and 599, not {action}")
        return action
    if isinstance(action, str) and action in SCRIPT_ACTIONS:
        return action
    raise ValueError(
        f"bad script action {action!r}: use an HTTP status or one of {', '.join(SCRIPT_ACTIONS)}"
    )


def format_retry_after(value: float | str | None) -> str | None:
    """Return the Retry-After header value for a setting (whole numbers without decimals)."""
    if value is None or isinstance(value, str):
        return value
    if float(value).is_integer():
        return str(int(value))
    return str(value)


class _Gate:
    """A closed gate: how many requests may still pass, and the event set when it opens."""

    __slots__ = ("generation", "opened", "passes")

    def __init__(self, generation: int) -> None:
        self.generation = generation  # gates made later have higher numbers
        self.opened = asyncio.Event()
        self.passes = 0


class Faults:
    """Run-time fault settings and scripts of one emulator; see the module docstring.

    Args:
        seed: The seed of the random draws.
    """

    def __init__(self, seed: int = 0) -> None:
        self._settings: dict[str, dict[str, Any]] = {}
        self._scripts: dict[str, deque[int | str]] = {}
        self._rng = random.Random(seed)
        # Closed gates by endpoint (or "*").
        self._gates: dict[str, _Gate] = {}
        self._gate_generation = 0
        self._parked: Counter[str] = Counter()
        self._parked_changed: list[asyncio.Future[None]] = []

    def set(self, endpoint: str = "*", **settings: Any) -> FaultConfig:
        """Change some settings of an endpoint (or "*") and return its effective config.

        Raises ValueError for an unknown endpoint or setting, a rate outside [0, 1], or rates
        of one endpoint that add up to more than 1.

        Args:
            endpoint: The endpoint's name (``search``, ``extract``, ``link``, ...) or ``"*"``.
            **settings: The settings to change (the fields of ``FaultConfig``).

        Returns:
            The endpoint's effective settings.
        """
        check_endpoint(endpoint)
        checked = {name: _check_value(name, value) for name, value in settings.items()}
        prospective = dict(self._settings)
        prospective[endpoint] = {**self._settings.get(endpoint, {}), **checked}
        for name in ENDPOINTS:
            merged = {**prospective.get("*", {}), **prospective.get(name, {})}
            total = sum(float(merged.get(rate, 0.0)) for rate in _RATE_ACTIONS)
            if total > 1.0 + 1e-9:
                raise ValueError(f"the fault rates of {name!r} add up to {total:g}, more than 1")
        self._settings = prospective
        return self.config(endpoint)

    def script(self, endpoint: str, sequence: Iterable[int | str]) -> None:
        """Answer the next requests of an endpoint (or "*") with these actions, in order.

        An action is an HTTP status (2xx means "answer normally"; others get the JSON error
        body, 429 with Retry-After) or "ok", "drop", "truncate" or "slow". A script replaces the
        endpoint's previous one; while it lasts the random rates are not drawn. An endpoint's
        own script goes before the "*" script.

        Args:
            endpoint: The endpoint's name (``search``, ``extract``, ``link``, ...) or ``"*"``.
            sequence: The actions, in order.
        """
        check_endpoint(endpoint)
        actions = deque(_check_action(a) for a in sequence)
        if actions:
            self._scripts[endpoint] = actions
        else:
            self._scripts.pop(endpoint, None)

    def clear(self, endpoint: str | None = None) -> None:
        """Remove the settings, script and gate of one endpoint, or of all when None.

        A closed gate is opened, so nothing stays parked.

        Args:
            endpoint: The endpoint (or ``"*"``); ``None``: every one.
        """
        if endpoint is None:
            self._settings.clear()
            self._scripts.clear()
            self.release()
            return
        check_endpoint(endpoint)
        self._settings.pop(endpoint, None)
        self._scripts.pop(endpoint, None)
        self.release(endpoint)

    # ------------------------------------------------------------------ gates

    def hold(self, endpoint: str = "*", *, after: int = 0) -> None:
        """Close the gate of an endpoint (or "*", every endpoint) until ``release``.

        The next ``after`` requests still pass; each later request that reaches the closed gate
        is counted and parked (it stays in flight, the connection open, nothing answered);
        ``release`` lets the parked requests go on to the other faults and their answer. Holding
        a held gate only resets ``after``. Use it where a test needs "the other side is still
        running": hold, start it, ``await wait_parked()``, act, release. Call it from the
        emulator's event loop (or over HTTP).

        Args:
            endpoint: The endpoint's name (``search``, ``extract``, ``link``, ...) or ``"*"``.
            after: How many requests still pass before the gate parks them.
        """
        check_endpoint(endpoint)
        if isinstance(after, bool) or not isinstance(after, int) or after < 0:
            raise ValueError("after must be a non-negative integer")
        gate = self._gates.get(endpoint)
        if gate is None:
            self._gate_generation += 1
            gate = self._gates[endpoint] = _Gate(self._gate_generation)
        gate.passes = after

    def release(self, endpoint: str | None = None) -> None:
        """Open the gate of an endpoint (or "*"), or every gate when None; idempotent.

        Args:
            endpoint: The endpoint (or ``"*"``); ``None``: every gate.
        """
        names = list(self._gates) if endpoint is None else [check_endpoint(endpoint)]
        for name in names:
            gate = self._gates.pop(name, None)
            if gate is not None:
                gate.opened.set()

    def held(self) -> list[str]:
        """Return the endpoints (and "*") whose gate is closed, sorted."""
        return sorted(self._gates)

    def parked(self, endpoint: str | None = None) -> int:
        """Return how many requests to ``endpoint`` (all when None) are parked at a gate now.

        Args:
            endpoint: The endpoint; ``None``: all of them.
        """
        if endpoint is None:
            return sum(self._parked.values())
        check_endpoint(endpoint)
        if endpoint == "*":
            return sum(self._parked.values())
        return self._parked[endpoint]

    async def wait_parked(self, count: int = 1, endpoint: str | None = None) -> int:
        """Wait until at least ``count`` requests to ``endpoint`` (all when None) are parked.

        Returns the number parked. It waits as long as it takes: put it under a deadline
        (``asyncio.timeout``) in a test.

        Args:
            count: How many parked requests to wait for.
            endpoint: The endpoint; ``None``: all of them.
        """
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError("count must be a positive integer")
        while True:
            now = self.parked(endpoint)
            if now >= count:
                return now
            waiter = asyncio.get_running_loop().create_future()
            self._parked_changed.append(waiter)
            try:
                await waiter
            finally:
                if waiter in self._parked_changed:
                    self._parked_changed.remove(waiter)

    def gate_snapshot(self) -> dict[str, Any]:
        """Return the closed gates and the parked requests as JSON-ready data."""
        return {
            "held": self.held(),
            "parked": {name: n for name, n in sorted(self._parked.items()) if n},
        }

    async def pass_gate(self, endpoint: str) -> None:
        """Park a request to ``endpoint`` while its gate or the "*" gate is closed.

        Once parked, the request waits only on gates that were closed when it parked: a
        ``hold`` right after the ``release`` that woke it makes a new gate for later requests.

        Args:
            endpoint: The endpoint of the request.
        """
        newest: int | None = None  # the newest gate that can hold this request, once parked
        while True:
            gate = next(
                (
                    found
                    for found in (self._gates.get(endpoint), self._gates.get("*"))
                    if found is not None and (newest is None or found.generation <= newest)
                ),
                None,
            )
            if gate is None:
                return
            if gate.passes > 0:
                gate.passes -= 1
                return
            if newest is None:
                newest = self._gate_generation
            self._parked[endpoint] += 1
            self._notify_parked()
            try:
                await gate.opened.wait()
            finally:
                self._parked[endpoint] -= 1
                if not self._parked[endpoint]:
                    del self._parked[endpoint]
                self._notify_parked()

    def _notify_parked(self) -> None:
        waiters, self._parked_changed = self._parked_changed, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def reseed(self, seed: int) -> None:
        """Restart the random draws from ``seed`` (for reproducible runs).

        Args:
            seed: The new seed.
        """
        self._rng = random.Random(seed)

    def config(self, endpoint: str) -> FaultConfig:
        """Return the effective settings of an endpoint ("*" settings under its own).

        Args:
            endpoint: The endpoint's name (``search``, ``extract``, ``link``, ...) or ``"*"``.
        """
        check_endpoint(endpoint)
        merged = {**self._settings.get("*", {}), **self._settings.get(endpoint, {})}
        return FaultConfig(**merged)

    def remaining_script(self, endpoint: str) -> list[int | str]:
        """Return the actions still scripted for an endpoint (or "*").

        Args:
            endpoint: The endpoint's name (``search``, ``extract``, ``link``, ...) or ``"*"``.
        """
        return list(self._scripts.get(endpoint, ()))

    def snapshot(self) -> dict[str, Any]:
        """Return the settings and scripts as JSON-ready data (for the HTTP control API)."""
        return {
            "settings": {name: dict(values) for name, values in self._settings.items()},
            "scripts": {name: list(actions) for name, actions in self._scripts.items()},
        }

    def apply(self, payload: Mapping[str, Any]) -> FaultConfig:
        """Apply a JSON control body: ``{"endpoint": "search", "<setting>": value, ...}``.

        Args:
            payload: The body: ``endpoint`` (default ``"*"``) and the settings to change.

        Returns:
            The endpoint's effective settings.
        """
        settings = dict(payload)
        endpoint = settings.pop("endpoint", "*")
        if not isinstance(endpoint, str):
            raise ValueError("endpoint must be a string")
        return self.set(endpoint, **settings)

    def decide(self, endpoint: str) -> FaultDecision:
        """Return what to do with the next request to ``endpoint`` (consumes script and RNG).

        Args:
            endpoint: The endpoint of the request.
        """
        config = self.config(endpoint)
        retry_after = format_retry_after(config.retry_after)
        common: dict[str, Any] = {
            "latency": config.latency,
            "retry_after": retry_after,
            "slow_chunks": config.slow_chunks,
            "slow_chunk_delay": config.slow_chunk_delay,
        }
        for name in (endpoint, "*"):
            queue = self._scripts.get(name)
            if queue:
                action = queue.popleft()
                if not queue:
                    del self._scripts[name]
                return _scripted(action, common)
        rates = [getattr(config, rate) for rate in _RATE_ACTIONS]
        if not any(rates):
            return FaultDecision(action="pass", **common)
        draw = self._rng.random()
        edge = 0.0
        for rate, action in zip(rates, _RATE_ACTIONS.values(), strict=True):
            edge += rate
            if draw < edge:
                return _scripted(action, common)
        return FaultDecision(action="pass", **common)


def _scripted(action: int | str, common: dict[str, Any]) -> FaultDecision:
    """What a scripted action, or the one a drawn rate stands for, does."""
    if isinstance(action, int):
        if 200 <= action < 300:
            return FaultDecision(action="pass", **common)
        return FaultDecision(action="status", status=action, **common)
    return FaultDecision(action=_SCRIPT_DECISIONS[action], **common)
