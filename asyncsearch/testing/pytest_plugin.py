"""pytest fixtures running the emulator; opt in per project or module, it is never auto-loaded.

Enable with ``pytest_plugins = ["asyncsearch.testing.pytest_plugin"]`` in the root conftest.py
(or a test module). Fixtures (function scope, async, need pytest-asyncio):

- ``asyncsearch_emulator``: a running ``ServiceEmulator(api_key="test-key", seed=7)``.
- ``asyncsearch_client``: an ``asyncsearch.AsyncSearchClient`` pointed at that emulator, opened
  with ``async with`` and closed after the test.

Change the emulator's options (any keyword argument of ``ServiceEmulator``) for one test with
the marker ``@pytest.mark.asyncsearch_emulator(seed=3, n_resources=50, first_page=0)`` (the
marker is registered when the plugin is enabled from conftest.py), or for a module, class or
test by overriding the ``asyncsearch_emulator_options`` fixture, which returns the base options
(``{"api_key": "test-key", "seed": 7}``) that the marker's keywords update.
"""

from __future__ import annotations

import importlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from ._emulator import ServiceEmulator

__all__ = ["asyncsearch_client", "asyncsearch_emulator", "asyncsearch_emulator_options"]

DEFAULT_OPTIONS: dict[str, Any] = {"api_key": "test-key", "seed": 7}


def pytest_configure(config: pytest.Config) -> None:
    """Register the ``asyncsearch_emulator`` marker (so --strict-markers accepts it)."""
    config.addinivalue_line(
        "markers",
        "asyncsearch_emulator(**options): keyword arguments for the ServiceEmulator of the "
        "asyncsearch_emulator fixture",
    )


@pytest.fixture
def asyncsearch_emulator_options() -> dict[str, Any]:
    """Return the ``ServiceEmulator`` options of ``asyncsearch_emulator``; override to change."""
    return dict(DEFAULT_OPTIONS)


@pytest_asyncio.fixture
async def asyncsearch_emulator(
    request: pytest.FixtureRequest, asyncsearch_emulator_options: dict[str, Any]
) -> AsyncIterator[ServiceEmulator]:
    """Yield a running emulator (seeded unless the options say otherwise); stopped after."""
    options = dict(asyncsearch_emulator_options)
    marker = request.node.get_closest_marker("asyncsearch_emulator")
    if marker is not None:
        options.update(marker.kwargs)
    async with ServiceEmulator(**options) as emulator:
        yield emulator


@pytest_asyncio.fixture
async def asyncsearch_client(asyncsearch_emulator: ServiceEmulator) -> AsyncIterator[Any]:
    """Yield an open ``AsyncSearchClient`` talking to the ``asyncsearch_emulator`` fixture."""
    # Imported here, not at the top: the emulator never depends on the client it tests.
    asyncsearch = importlib.import_module("asyncsearch")
    client = asyncsearch.AsyncSearchClient(
        api_key=asyncsearch_emulator.api_key, base_url=asyncsearch_emulator.base_url
    )
    async with client:
        yield client
