"""Every msgspec Struct of the wire format, for annotating the parts of a response.

The top-level package exports the models a caller meets first (``SearchPage``, ``SearchHit``,
``ExtractionJob``, ...); this module holds all of them, including the nested parts (``Chunk``
of a hit is ``SearchChunk``, a job's ``extraction.media`` is ``ExtractionMedia``, ...), the
request Structs, the ``Literal`` types of the closed value sets and ``IN_PROGRESS_JOB_STATES``::

    from asyncsearch.models import SearchChunk

    def best_chunk(chunks: list[SearchChunk]) -> SearchChunk | None: ...

Every Struct has ``to_dict()`` and ``to_json()`` (wire names).
"""

from __future__ import annotations

# Every public Struct and value set, named once: in _models.__all__.
from ._models import *  # noqa: F403
from ._models import __all__ as __all__
