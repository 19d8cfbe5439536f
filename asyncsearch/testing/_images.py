"""Image fingerprints for image search: exact bytes always, a small thumbnail with Pillow.

An image added as a resource keeps a fingerprint: the SHA-256 of its bytes and, when Pillow is
installed and can decode them, a 16 x 16 grey thumbnail with its mean subtracted. Two
fingerprints are as similar as:

- 1.0 when the bytes are identical (with or without Pillow);
- else, with both thumbnails, their correlation (cosine of the mean-centred thumbnails) clamped
  to [0, 1] and capped at 0.99, so that a re-encoded or resized copy of a picture scores close
  to 1 and an unrelated picture close to 0, and an identical copy always ranks above a
  look-alike; two flat (single-colour) pictures score by the difference of their grey levels;
- else 0.0.

Nothing is downloaded and no model is involved. Decoding is guarded: a decompression bomb or
bytes Pillow cannot read give a fingerprint without a thumbnail, never an error.
"""

from __future__ import annotations

import hashlib
import io
import math
import warnings
from dataclasses import dataclass

try:
    from PIL import Image

    HAVE_PILLOW = True
except ImportError:  # pragma: no cover - exercised only where Pillow is absent
    HAVE_PILLOW = False

__all__ = [
    "HAVE_PILLOW",
    "THUMBNAIL_SIDE",
    "ImageFingerprint",
    "fingerprint",
    "recognised",
    "similarity",
]

THUMBNAIL_SIDE = 16
# A look-alike never reaches an identical copy's 1.0.
MAX_LOOKALIKE_SCORE = 0.99
# Below this spread of grey levels a thumbnail counts as flat (one colour).
_FLAT_NORM = 1e-6


@dataclass(frozen=True, slots=True)
class ImageFingerprint:
    """What image search compares: the bytes' digest and, with Pillow, a centred thumbnail."""

    digest: bytes
    thumbnail: tuple[float, ...] | None = None
    mean: float = 0.0
    norm: float = 0.0


def recognised(data: bytes) -> bool:
    """Return True when Pillow is installed and recognises the bytes as a picture.

    Reads the header only (microseconds): bytes it does not recognise are compared by their
    digest alone, with no decoding to hand to another thread.
    """
    if not HAVE_PILLOW:
        return False
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with Image.open(io.BytesIO(data)):
                return True
    except Exception:
        return False


def _grey_thumbnail(data: bytes) -> bytes | None:
    """Return the 16 x 16 grey levels of an image, or None when Pillow is absent or cannot."""
    if not HAVE_PILLOW:
        return None
    side = THUMBNAIL_SIDE
    try:
        with warnings.catch_warnings():
            # Pillow warns about odd but readable files (palette transparency, EXIF): not our
            # business here; a decompression bomb warning is turned into a refusal.
            warnings.simplefilter("ignore")
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as image:
                image.draft("L", (side * 4, side * 4))  # JPEG: decode at a reduced scale
                grey = image.convert("L").resize((side, side), Image.Resampling.BOX)
                return grey.tobytes()
    except Exception:
        # Any failure to decode (unknown format, truncated or hostile bytes, a bomb) only
        # means the picture is compared by its exact bytes.
        return None


def fingerprint(data: bytes, *, digest: bytes | None = None) -> ImageFingerprint:
    """Return the fingerprint image search compares for these image bytes.

    ``digest`` is their SHA-256 when the caller has it already.
    """
    if digest is None:
        digest = hashlib.sha256(data).digest()
    levels = _grey_thumbnail(data)
    if levels is None:
        return ImageFingerprint(digest)
    mean = sum(levels) / len(levels)
    centred = tuple(level - mean for level in levels)
    norm = math.sqrt(sum(v * v for v in centred))
    return ImageFingerprint(digest, centred, mean, norm)


def similarity(query: ImageFingerprint, stored: ImageFingerprint) -> float:
    """Return how alike two images are, in [0, 1] (see the module docstring)."""
    if query.digest == stored.digest:
        return 1.0
    if query.thumbnail is None or stored.thumbnail is None:
        return 0.0
    query_flat, stored_flat = query.norm < _FLAT_NORM, stored.norm < _FLAT_NORM
    if query_flat or stored_flat:
        if not (query_flat and stored_flat):
            return 0.0
        return MAX_LOOKALIKE_SCORE * (1.0 - abs(query.mean - stored.mean) / 255.0)
    dot = sum(a * b for a, b in zip(query.thumbnail, stored.thumbnail, strict=True))
    return min(max(dot / (query.norm * stored.norm), 0.0), MAX_LOOKALIKE_SCORE)
