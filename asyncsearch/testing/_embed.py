"""A hashing embedder: deterministic text and image vectors with no model and no network.

Every token of a text is hashed (BLAKE2b, salted per vector space) onto a few signed integer
features: the whole token with weight 2 and, for tokens longer than four letters, its first
four letters with weight 1 (so "invoice" and "invoicing" come out close). A text's vector is the
sum of the features of its tokens; cosine similarity of two vectors is their integer dot
product over the product of their norms. Integer counts are kept (not floats) so the numpy and
the pure-Python search paths compute bit-identical scores and therefore identical rankings.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import re
from collections import Counter
from collections.abc import Iterable

__all__ = [
    "CLIP2",
    "CLIP2_DIM",
    "FAKE_IMAGE_TEXT_BYTES",
    "SMALL3",
    "SMALL3_DIM",
    "STOPWORDS",
    "HashingEmbedder",
    "decode_data_url",
    "fake_image_data_url",
    "image_counts",
    "tokenize",
]

SMALL3_DIM = 512
CLIP2_DIM = 768

_TOKEN_RE = re.compile(r"[^\W_]+")
_DATA_URL_RE = re.compile(r"^data:([^,;]*)((?:;[^,;]*)*);base64,", re.ASCII)
# RFC 2045 media type: type "/" subtype, each a token (any CHAR but specials, space, controls).
_IMAGE_TYPE_RE = re.compile(r"image/[!#$%&'*+\-.^_`|~0-9A-Za-z]+", re.ASCII | re.IGNORECASE)
#: Image bytes up to this length that are UTF-8 text are a fake image, embedded like text.
FAKE_IMAGE_TEXT_BYTES = 1024
# How many signed features a picture's digest gives its clip2 vector.
_DIGEST_FEATURES = 8
# The per-token feature cache is dropped when it grows past this, so that a long-running
# emulator fed endless distinct words stays small.
_FEATURE_CACHE_LIMIT = 1 << 16

STOPWORDS = frozenset(
    [
        "a",
        "about",
        "above",
        "after",
        "again",
        "against",
        "all",
        "am",
        "an",
        "and",
        "any",
        "are",
        "as",
        "at",
        "be",
        "because",
        "been",
        "before",
        "being",
        "below",
        "between",
        "both",
        "but",
        "by",
        "can",
        "could",
        "did",
        "do",
        "does",
        "doing",
        "down",
        "during",
        "each",
        "few",
        "for",
        "from",
        "further",
        "had",
        "has",
        "have",
        "having",
        "he",
        "her",
        "here",
        "hers",
        "herself",
        "him",
        "himself",
        "his",
        "how",
        "i",
        "if",
        "in",
        "into",
        "is",
        "it",
        "its",
        "itself",
        "just",
        "me",
        "more",
        "most",
        "my",
        "myself",
        "no",
        "nor",
        "not",
        "now",
        "of",
        "off",
        "on",
        "once",
        "only",
        "or",
        "other",
        "our",
        "ours",
        "ourselves",
        "out",
        "over",
        "own",
        "same",
        "she",
        "should",
        "so",
        "some",
        "such",
        "than",
        "that",
        "the",
        "their",
        "theirs",
        "them",
        "themselves",
        "then",
        "there",
        "these",
        "they",
        "this",
        "those",
        "through",
        "to",
        "too",
        "under",
        "until",
        "up",
        "very",
        "was",
        "we",
        "were",
        "what",
        "when",
        "where",
        "which",
        "while",
        "who",
        "whom",
        "why",
        "will",
        "with",
        "would",
        "you",
        "your",
        "yours",
        "yourself",
        "yourselves",
    ]
)


def _stem(word: str) -> str:
    # A light plural fold so "invoices" finds "invoice"; both sides of a match are folded alike.
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    return word


@functools.lru_cache(maxsize=1 << 16)
def _term(word: str) -> str:
    # Cached: texts reuse a small vocabulary, and this runs for every word of every resource.
    return "" if word in STOPWORDS else _stem(word)


def tokenize(text: str) -> list[str]:
    """Split text into the lower-cased, plural-folded, stopword-free terms search works on."""
    return [t for w in _TOKEN_RE.findall(text.casefold()) if (t := _term(w))]


class HashingEmbedder:
    """Maps tokens onto a fixed number of signed integer features of one vector space."""

    def __init__(self, dim: int, salt: str) -> None:
        self.dim = dim
        self._salt = salt.encode()
        self._cache: dict[str, tuple[tuple[int, int], ...]] = {}

    def _feature(self, key: str, weight: int) -> tuple[int, int]:
        digest = hashlib.blake2b(key.encode(), digest_size=8, salt=self._salt[:16]).digest()
        value = int.from_bytes(digest, "big")
        sign = 1 if value & 1 else -1
        return (value >> 1) % self.dim, sign * weight

    def features(self, token: str) -> tuple[tuple[int, int], ...]:
        """Return the (index, signed weight) pairs one token adds to a vector."""
        cached = self._cache.get(token)
        if cached is None:
            if len(self._cache) >= _FEATURE_CACHE_LIMIT:
                self._cache.clear()
            parts = [self._feature("w:" + token, 2)]
            if len(token) > 4:
                parts.append(self._feature("p:" + token[:4], 1))
            cached = tuple(parts)
            self._cache[token] = cached
        return cached

    def counts(self, tokens: Iterable[str]) -> dict[int, int]:
        """Return the sparse integer vector of some tokens (index -> count, zeros dropped)."""
        vector: dict[int, int] = {}
        for token, n in Counter(tokens).items():
            for index, weight in self.features(token):
                vector[index] = vector.get(index, 0) + n * weight
        return {i: v for i, v in vector.items() if v}


SMALL3 = HashingEmbedder(SMALL3_DIM, "small3_512")
CLIP2 = HashingEmbedder(CLIP2_DIM, "clip2")


def decode_data_url(value: str, *, require_padding: bool = False) -> bytes:
    """Return the bytes of a base64 data URL of an image; raise ValueError when it is not one.

    The media type must be ``image/<subtype>`` (parameters may follow). The payload is base64
    with the standard alphabet; its ``=`` padding is optional unless ``require_padding``.
    """
    match = _DATA_URL_RE.match(value)
    if match is None:
        raise ValueError("not a base64 data URL (data:<mime>;base64,<data>)")
    if not _IMAGE_TYPE_RE.fullmatch(match.group(1)):
        media_type = match.group(1) or "none (text/plain)"
        raise ValueError(f"the data URL's media type must be image/<subtype>, not {media_type}")
    payload = value[match.end() :]
    unpadded = payload.rstrip("=")
    missing = -len(unpadded) % 4
    if require_padding and len(payload) % 4:
        raise ValueError("the data URL's base64 payload must be padded with '=' to 4n characters")
    if len(payload) - len(unpadded) > missing or missing == 3:
        raise ValueError("the data URL's payload is not valid base64: wrong padding or length")
    try:
        return base64.b64decode(unpadded + "=" * missing, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"the data URL's payload is not valid base64: {exc}") from None


def image_counts(data: bytes, digest: bytes) -> dict[int, int]:
    """Return the sparse ``clip2`` vector of an image query, from its bytes and their SHA-256.

    A fake image (``fake_image_data_url``: at most ``FAKE_IMAGE_TEXT_BYTES`` of UTF-8 text) is
    embedded like its text. Any other picture gets a few signed features drawn from its digest:
    the same picture always gets the same vector, at the cost of hashing its bytes once.
    """
    if len(data) <= FAKE_IMAGE_TEXT_BYTES:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            pass
        else:
            return CLIP2.counts(tokenize(text))
    vector: dict[int, int] = {}
    for i in range(_DIGEST_FEATURES):
        value = int.from_bytes(digest[4 * i : 4 * i + 4], "big")
        index = (value >> 1) % CLIP2_DIM
        vector[index] = vector.get(index, 0) + (1 if value & 1 else -1)
    return {i: v for i, v in vector.items() if v}


def fake_image_data_url(content: str | bytes, mime: str = "image/png") -> str:
    """Return a fake image as a data URL, whose image search vector matches resources about
    ``content``.

    The emulator embeds a short image that is UTF-8 text (up to ``FAKE_IMAGE_TEXT_BYTES``) as
    that text, so an "image" made of the words "red bicycle" finds resources whose name,
    description or caption talk about red bicycles.

    Args:
        content: The words the image stands for (or their bytes).
        mime: The data URL's media type.

    Returns:
        ``data:<mime>;base64,...``.
    """
    raw = content.encode() if isinstance(content, str) else content
    return f"data:{mime};base64,{base64.b64encode(raw).decode('ascii')}"
