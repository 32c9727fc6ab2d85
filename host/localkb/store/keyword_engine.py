"""Which keyword engine a knowledge base uses, and the one seam both engines sit behind.

Both engines index exactly the ``(term, position)`` pairs of ``analysis.analyze`` and are
asked for the terms and phrases of ``analysis.plan_query``, so identifier semantics,
back-off and exact-term statuses cannot differ between them; each answers the same
operations (``KeywordEngine``). A knowledge base records its choice
in ``kbs.settings`` (``keyword_engine``: ``auto`` | ``whoosh`` | ``tantivy``); the index
is derived, so switching rebuilds it from the catalogue.

``auto`` (the default) is tantivy at every size: at 3,000 passages it is Whoosh's equal on
search and above that faster, and it writes each passage for about a quarter of Whoosh's
CPU, which an add spends beside the model (RESULTS.md "Which engine, by measurement" has
the figures). An ``auto`` knowledge base that an earlier rule wrote with Whoosh is moved
on its next open, its index rebuilt from the catalogue. ``whoosh`` pins Whoosh.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

from localkb.errors import InvalidInput
from localkb.store.keywords import KeywordHit, KeywordIndex
from localkb.store.listing import keyword_folder as folder_for

ENGINES = ("whoosh", "tantivy")
CHOICES = ("auto", *ENGINES)
#: The engine ``auto`` names.
AUTO = "tantivy"


class KeywordEngine(Protocol):
    """What the store and the search ask of a keyword index, whichever engine holds it."""

    engine: str
    generation: int

    def doc_count(self) -> int: ...
    def segment_count(self) -> int: ...
    def write(self, upserts: Iterable[tuple[str, str]], deletes: list[str], generation: int) -> None: ...
    def search(self, terms: list[str], limit: int) -> list[KeywordHit]: ...
    def phrase(self, terms: tuple[str, ...] | list[str], limit: int = 1000) -> list[str]: ...
    def chunks_with(self, term: str, limit: int = 20_000) -> list[str]: ...
    def doc_frequency(self, term: str) -> int: ...
    def close(self) -> None: ...


def check_choice(choice: object) -> str:
    if choice not in CHOICES:
        raise InvalidInput(f"the keyword engine must be one of {', '.join(CHOICES)}, not {choice!r}")
    return str(choice)


def effective(choice: str) -> str:
    """The engine a knowledge base with this choice uses."""
    return choice if choice in ENGINES else AUTO


def _cls(engine: str):
    if engine == "tantivy":
        from localkb.store.tantivy_index import TantivyIndex

        return TantivyIndex
    return KeywordIndex


def create(engine: str, folder: Path) -> KeywordEngine:
    return _cls(engine).create(folder)


def load(engine: str, folder: Path) -> KeywordEngine:
    return _cls(engine).load(folder)


def built_engine(kb_dir: Path) -> str | None:
    """The engine of the keyword index last saved in ``kb_dir`` (None: none saved)."""
    from localkb.atomic import read_json

    found = []
    for engine in ENGINES:
        meta = read_json(folder_for(kb_dir, engine).with_suffix(".json"))
        if meta is not None and meta.get("engine", "whoosh") == engine:
            found.append((meta.get("saved", 0), engine))
    return max(found)[1] if found else None
