"""The emulator's one error body shape, and the exception its handlers raise to produce it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

__all__ = [
    "CODES",
    "EmulatorHTTPError",
    "error_body",
    "not_found",
    "refused_as_422",
    "validation_error",
]

# The machine-readable code sent for each status; a status not listed gets "error".
CODES: dict[int, str] = {
    400: "bad_request",
    401: "unauthorized",
    404: "not_found",
    405: "method_not_allowed",
    408: "request_timeout",
    413: "payload_too_large",
    414: "uri_too_long",
    415: "unsupported_media_type",
    422: "validation_error",
    429: "rate_limited",
    431: "header_fields_too_large",
    500: "internal_error",
    501: "not_implemented",
    502: "bad_gateway",
    503: "service_unavailable",
    504: "gateway_timeout",
}


def error_body(
    status: int, message: str, *, code: str | None = None, field: str | None = None
) -> dict[str, Any]:
    """Return the JSON error body the emulator sends with every non-2xx answer."""
    return {
        "error": {
            "status": status,
            "code": code if code is not None else CODES.get(status, "error"),
            "message": message,
            "field": field,
        }
    }


class EmulatorHTTPError(Exception):
    """Raised inside a handler to answer with a JSON error body instead of a result."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        field: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.field = field
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        """Return the JSON error body for this error."""
        return error_body(self.status, self.message, code=self.code, field=self.field)


def validation_error(message: str, field: str | None = None) -> EmulatorHTTPError:
    """Return a 422 error naming the offending request field."""
    return EmulatorHTTPError(422, message, field=field)


@contextlib.contextmanager
def refused_as_422(
    field: str | None = None, errors: tuple[type[Exception], ...] = (ValueError,)
) -> Iterator[None]:
    """Answer the ``errors`` raised by checks of a request with a 422 naming ``field``."""
    try:
        yield
    except errors as exc:
        raise validation_error(str(exc), field) from None


def not_found(message: str, field: str | None = None) -> EmulatorHTTPError:
    """Return a 404 error."""
    return EmulatorHTTPError(404, message, field=field)
