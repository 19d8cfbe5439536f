"""Request bodies as the emulator reads them: content codings, the size cap, JSON decoding.

Pure functions of bytes, so that the emulator can run them off its event loop for large bodies.
aiohttp's own decompression is turned off (``auto_decompress=False``): it answers a body that
does not match its ``Content-Encoding`` with a plain-text 500 and an unknown coding with a
plain-text 400, before the emulator can answer in JSON. Here every failure is an
``EmulatorHTTPError``: 400 for a body that cannot be decoded, 413 beyond the cap, 415 for a
content coding other than ``gzip``, ``x-gzip``, ``deflate`` and ``identity``.
"""

from __future__ import annotations

import zlib
from typing import Any

import msgspec

from ._errors import EmulatorHTTPError
from ._requests import MAX_BODY_BYTES, MAX_BODY_DEPTH, nests_deeper_than

__all__ = [
    "ACCEPTED_CODINGS",
    "content_codings",
    "decode_content",
    "decode_json",
    "too_large",
]

#: The content codings a request body may have, as an ``Accept-Encoding`` value.
ACCEPTED_CODINGS = "gzip, deflate"
_GZIP = 16 + zlib.MAX_WBITS  # a gzip header and trailer
_ZLIB = zlib.MAX_WBITS  # RFC 1950, what HTTP's "deflate" names
_RAW_DEFLATE = -zlib.MAX_WBITS  # RFC 1951 alone, which some clients send as "deflate"


def too_large() -> EmulatorHTTPError:
    """Return the 413 for a body over ``MAX_BODY_BYTES`` (encoded or decoded)."""
    return EmulatorHTTPError(
        413,
        f"the request body is over {MAX_BODY_BYTES:,} bytes, the largest the spec's limits allow",
    )


def too_deep() -> EmulatorHTTPError:
    """Return the 400 for a body nested deeper than ``MAX_BODY_DEPTH``."""
    return EmulatorHTTPError(
        400, f"the request body nests arrays and objects deeper than {MAX_BODY_DEPTH} levels"
    )


def content_codings(headers: list[str]) -> list[str]:
    """Return the codings of ``Content-Encoding`` header values in the order they were applied.

    ``identity`` is dropped; ``x-gzip`` is ``gzip``. Raises a 415 naming what is accepted for
    any other coding (``br``, ``zstd``, ``compress``...).
    """
    codings: list[str] = []
    for value in headers:
        for item in value.split(","):
            coding = item.strip().lower()
            if coding in ("", "identity"):
                continue
            if coding == "x-gzip":
                coding = "gzip"
            if coding not in ("gzip", "deflate"):
                raise EmulatorHTTPError(
                    415,
                    f"Content-Encoding {item.strip()!r} is not supported; send the body as is "
                    f"or with {ACCEPTED_CODINGS}",
                    field="Content-Encoding",
                    headers={"Accept-Encoding": ACCEPTED_CODINGS},
                )
            codings.append(coding)
    return codings


def decode_content(raw: bytes, codings: list[str]) -> bytes:
    """Undo the content codings of a body (the last applied first), within the size cap."""
    for coding in reversed(codings):
        raw = _inflate(raw, coding)
    return raw


def _inflate(data: bytes, coding: str) -> bytes:
    if coding == "gzip":
        wbits = _GZIP
    elif len(data) >= 2 and data[0] & 0x0F == 8 and int.from_bytes(data[:2], "big") % 31 == 0:
        wbits = _ZLIB  # a valid zlib header (RFC 1950 section 2.2)
    else:
        wbits = _RAW_DEFLATE
    out = bytearray()
    rest = data
    while True:
        inflater = zlib.decompressobj(wbits)
        try:
            # One more byte than the cap allows tells "over the cap" from "exactly at it".
            out += inflater.decompress(rest, MAX_BODY_BYTES + 1 - len(out))
        except zlib.error as exc:
            raise _undecodable(coding, str(exc)) from None
        if len(out) > MAX_BODY_BYTES:
            raise too_large()
        if not inflater.eof:
            raise _undecodable(coding, "the compressed data ends early")
        rest = inflater.unused_data
        # A gzip body may be several members one after the other (RFC 1952 section 2.2).
        if not rest or wbits != _GZIP:
            break
    if rest:
        raise _undecodable(coding, f"{len(rest)} bytes follow the compressed data")
    return bytes(out)


def _undecodable(coding: str, reason: str) -> EmulatorHTTPError:
    return EmulatorHTTPError(
        400,
        f"the request body is not {coding} data as its Content-Encoding says ({reason})",
        field="Content-Encoding",
    )


def decode_json(raw: bytes) -> Any:
    """Return the JSON value of a body; 400 when empty, not UTF-8, not JSON or too deep."""
    if not raw.strip():
        raise EmulatorHTTPError(400, "the request body is empty; send a JSON object")
    try:
        body = msgspec.json.decode(raw)
    except UnicodeDecodeError as exc:
        # msgspec reports bad UTF-8 inside a string this way, not as a DecodeError.
        bad = exc.object[exc.start]
        raise EmulatorHTTPError(
            400, f"the request body is not valid UTF-8 ({exc.reason}: byte {bad:#04x})"
        ) from None
    except msgspec.DecodeError as exc:
        raise EmulatorHTTPError(400, f"the request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise too_deep() from None
    # Decoding fails only where the stack runs out, a depth that varies with the Python
    # version and the caller, and a body just short of it would exhaust the stack later
    # (copied or encoded): a fixed cap instead. Fewer brackets than the cap cannot nest
    # past it, which spares the walk for nearly every body.
    if raw.count(b"[") + raw.count(b"{") > MAX_BODY_DEPTH and nests_deeper_than(
        body, MAX_BODY_DEPTH
    ):
        raise too_deep()
    return body
