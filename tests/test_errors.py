"""The error tree: every error survives pickling (multiprocessing, Ray) as itself."""

from __future__ import annotations

import pickle

import pytest
from multidict import CIMultiDict, CIMultiDictProxy

from asyncsearch import (
    APIConnectionError,
    APIStatusError,
    AsyncSearchError,
    PoolTimeoutError,
    RateLimitError,
    ResponseTooLargeError,
    ResponseValidationError,
    WaitTimeoutError,
)
from asyncsearch import _protocol as protocol
from asyncsearch.models import ExtractionJob


def _status_errors() -> list[AsyncSearchError]:
    headers = CIMultiDictProxy(CIMultiDict({"Retry-After": "2", "X-Request-Id": "r1"}))
    return [
        protocol.status_error(
            protocol.Response(status=status, headers=headers, body=b'{"message": "no"}', url="u"),
            method="GET",
            attempts=2,
            retry_after=2.0 if status == 429 else None,
        )
        for status in (400, 401, 403, 404, 409, 418, 422, 429, 500, 503)
    ]


ERRORS: list[AsyncSearchError] = [
    *_status_errors(),
    APIConnectionError("reset", retryable=False, request_sent=False, attempts=3),
    PoolTimeoutError("no connection"),
    ResponseValidationError("bad body", path="$.hits[0]", body=b"{}", attempts=1),
    ResponseTooLargeError("too large", limit=10),
    WaitTimeoutError("not done", job=ExtractionJob(id="j", state="pending"), attempts=4),
    AsyncSearchError("plain"),
]


@pytest.mark.parametrize("error", ERRORS, ids=lambda e: type(e).__name__)
def test_every_error_pickles_as_itself(error: AsyncSearchError) -> None:
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error)
    assert str(copy) == str(error)
    assert copy.args == error.args
    assert copy.attempts == error.attempts
    for name, value in vars(error).items():
        if name == "headers":
            assert dict(getattr(copy, name).items()) == dict(value.items())
        else:
            assert getattr(copy, name) == value, name
    if isinstance(error, APIStatusError):
        assert isinstance(copy, APIStatusError)
        assert copy.status_code == error.status_code
    if isinstance(error, RateLimitError):
        assert isinstance(copy, RateLimitError)
        assert copy.retry_after == 2.0
