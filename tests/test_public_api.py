"""The public surface: a complete, sorted ``__all__``, and a light ``import asyncsearch``."""

from __future__ import annotations
import __future__

import subprocess
import sys
import types

import asyncsearch


def _isort_key(name: str) -> tuple[int, str]:
    # ruff's RUF022 order: CONSTANTS, then Classes, then functions and dunders.
    if name.isupper():
        return (0, name)
    if name[0].isupper():
        return (1, name)
    return (2, name)


def test_all_is_sorted_and_unique() -> None:
    assert asyncsearch.__all__ == sorted(asyncsearch.__all__, key=_isort_key)
    assert len(set(asyncsearch.__all__)) == len(asyncsearch.__all__)


def test_all_is_complete() -> None:
    public = {
        name
        for name, value in vars(asyncsearch).items()
        if not name.startswith("_")
        and not isinstance(value, types.ModuleType | __future__._Feature)
    }
    assert public | {"__version__"} == set(asyncsearch.__all__)
    for name in asyncsearch.__all__:
        assert hasattr(asyncsearch, name)


def test_error_tree() -> None:
    assert issubclass(asyncsearch.APITimeoutError, asyncsearch.APIConnectionError)
    assert issubclass(asyncsearch.PoolTimeoutError, asyncsearch.APITimeoutError)
    for status_error in (
        asyncsearch.BadRequestError,
        asyncsearch.AuthenticationError,
        asyncsearch.PermissionDeniedError,
        asyncsearch.NotFoundError,
        asyncsearch.ConflictError,
        asyncsearch.UnprocessableEntityError,
        asyncsearch.RateLimitError,
        asyncsearch.InternalServerError,
    ):
        assert issubclass(status_error, asyncsearch.APIStatusError)
    for name in asyncsearch.__all__:
        value = getattr(asyncsearch, name)
        if isinstance(value, type) and issubclass(value, BaseException):
            assert issubclass(value, asyncsearch.AsyncSearchError), name
    assert issubclass(asyncsearch.InvalidRequestError, ValueError)
    assert issubclass(asyncsearch.ConfigurationError, ValueError)
    assert issubclass(asyncsearch.ClientClosedError, RuntimeError)
    assert issubclass(asyncsearch.WaitTimeoutError, TimeoutError)


def test_import_stays_light() -> None:
    code = (
        "import sys, asyncsearch; "
        "heavy = [m for m in ('numpy', 'asyncsearch.testing', 'asyncsearch._cli', 'rich', "
        "'asyncsearch.ray', 'ray', 'pyarrow') "
        "if m in sys.modules]; print(heavy)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == "[]"
