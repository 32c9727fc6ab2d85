"""The keyword side: a Whoosh BM25F index per knowledge base.

What a passage is indexed under (terms and positions) and what a query asks for come
from ``analysis.py``, which knows no engine; this module only maps those terms onto
Whoosh: an OR query scored by BM25F with the terms each hit matched, an adjacent-phrase
query, and "which passages hold this term". Another engine implements the same four
calls (``search``, ``phrase``, ``doc_frequency``, ``chunks_with``) on the same terms.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from whoosh.analysis import Token, Tokenizer

from localkb import __version__
from localkb.atomic import read_json, write_json
from localkb.errors import IndexUnavailable
from localkb.store.analysis import analyze

#: What the saved index was analysed with; an index of another schema is rebuilt from the
#: catalogue on open (2: positions, qualified suffixes, version terms).
SCHEMA = 2


@lru_cache(maxsize=1)
def _weighting():
    """BM25F with the idf of Lucene's BM25, ``log(1 + (N - df + 0.5) / (df + 0.5))``.

    Whoosh's own idf, ``log(N / (df + 1)) + 1``, never falls below about 1, so a word
    in every passage still counts a tenth of the rarest one; on a long question its
    common words then outvote the telling ones. SciFact keyword nDCG@10 0.651 -> 0.656
    with this idf (fresh build, passages of 96 tokens), hybrid unchanged (DESIGN.md).
    """
    from math import log

    from whoosh.scoring import BM25F

    class LuceneIdfBM25F(BM25F):
        def idf(self, searcher, fieldname, text):
            parent = searcher.get_parent()
            df = parent.doc_frequency(fieldname, text)
            n = parent.doc_count_all()
            return log(1 + (n - df + 0.5) / (df + 0.5))

    return LuceneIdfBM25F()


class AnalysisTokenizer(Tokenizer):
    """Whoosh tokens from ``analysis.analyze`` (module level: Whoosh pickles it with the schema)."""

    def __call__(self, value, *, positions=False, chars=False, removestops=True, start_pos=0,
                 start_char=0, mode="", **kwargs):
        t = Token(positions, chars, removestops=removestops, mode=mode, **kwargs)
        for term, pos in analyze(value):
            t.text = term
            t.boost = 1.0
            t.stopped = False
            if positions:
                t.pos = start_pos + pos
            if chars:  # not stored (the schema keeps no character offsets)
                t.startchar = t.endchar = start_char
            yield t


def _schema():
    from whoosh.fields import ID, TEXT, Schema

    return Schema(chunk_id=ID(stored=True, unique=True),
                  content=TEXT(analyzer=AnalysisTokenizer(), phrase=True))


@dataclass
class KeywordHit:
    chunk_id: str
    bm25: float
    terms: frozenset[str]  # the query terms this chunk contains

    @property
    def matched(self) -> int:
        return len(self.terms)


class KeywordIndex:
    """Whoosh index in its own folder plus ``<folder>.json`` with the generation it reflects."""

    def __init__(self, folder: Path, ix) -> None:
        self.folder = folder
        self.meta_path = folder.with_suffix(".json")
        self.ix = ix
        self.generation = -1
        self._searcher = None

    @classmethod
    def create(cls, folder: Path) -> KeywordIndex:
        from whoosh import index as windex

        try:
            if folder.is_dir():
                shutil.rmtree(folder)
            folder.mkdir(parents=True)
            ki = cls(folder, windex.create_in(str(folder), _schema()))
        except OSError as err:
            raise IndexUnavailable(f"keyword index {folder.name} could not be created: {err}") from err
        ki.generation = 0
        return ki

    @classmethod
    def load(cls, folder: Path) -> KeywordIndex:
        from whoosh import index as windex

        meta = read_json(folder.with_suffix(".json"))
        if meta is None or not folder.exists():
            raise IndexUnavailable(f"no keyword index at {folder.name}")
        if meta.get("schema", 1) != SCHEMA:
            raise IndexUnavailable(f"keyword index {folder.name} was analysed with schema "
                                   f"{meta.get('schema', 1)}, not {SCHEMA}: it is rebuilt on open")
        try:
            ix = windex.open_dir(str(folder))
        except Exception as err:
            raise IndexUnavailable(f"keyword index {folder.name} could not be read: {err}") from err
        ki = cls(folder, ix)
        ki.generation = int(meta.get("generation", -1))
        return ki

    def doc_count(self) -> int:
        return self.ix.doc_count()

    def write(self, upserts: Iterable[tuple[str, str]], deletes: list[str], generation: int) -> None:
        """Apply changes in one Whoosh commit, then record the generation.

        ``upserts`` may be a generator (a big switch streams its passages through here).
        """
        upserts = iter(upserts)
        first = next(upserts, None)
        if first is not None or deletes:
            try:
                writer = self.ix.writer(limitmb=128)
                try:
                    for cid in deletes:
                        writer.delete_by_term("chunk_id", cid)
                    if first is not None:
                        writer.update_document(chunk_id=first[0], content=first[1])
                    for cid, content in upserts:
                        writer.update_document(chunk_id=cid, content=content)
                except BaseException:
                    writer.cancel()
                    raise
                writer.commit()
            except Exception as err:
                raise IndexUnavailable(f"keyword index update failed: {err}") from err
        try:
            write_json(self.meta_path, {"generation": generation, "schema": SCHEMA,
                                        "count": self.doc_count(),
                                        "saved": time.time(), "localkb": __version__})
        except OSError as err:
            raise IndexUnavailable(f"keyword index {self.folder.name} could not be saved: {err}") from err
        self.generation = generation
        self._close_searcher()

    def _close_searcher(self) -> None:
        if self._searcher is not None:
            self._searcher.close()
            self._searcher = None

    def searcher(self):
        if self._searcher is None:
            self._searcher = self.ix.searcher(weighting=_weighting())
        else:
            self._searcher = self._searcher.refresh()
        return self._searcher

    def search(self, terms: list[str], limit: int) -> list[KeywordHit]:
        """BM25F, any term may match (OR), with the terms each hit holds."""
        from whoosh.query import Or, Term

        if not terms or limit <= 0:
            return []
        query = Or([Term("content", t) for t in terms])
        try:
            results = self.searcher().search(query, limit=limit, terms=True)
            return [KeywordHit(hit["chunk_id"], float(hit.score),
                               frozenset(t.decode("utf-8") if isinstance(t, bytes) else t
                                         for _f, t in hit.matched_terms()))
                    for hit in results]
        except Exception as err:
            raise IndexUnavailable(f"keyword search failed: {err}") from err

    def phrase(self, terms: tuple[str, ...] | list[str], limit: int = 1000) -> list[str]:
        """Chunk ids of passages holding ``terms`` at adjacent positions, in order (one term: holding it)."""
        from whoosh.query import Phrase, Term

        if not terms:
            return []
        query = Term("content", terms[0]) if len(terms) == 1 else Phrase("content", list(terms))
        return self._chunk_ids(query, limit)

    def chunks_with(self, term: str, limit: int = 20_000) -> list[str]:
        """Chunk ids of (at most ``limit``) passages holding ``term``."""
        from whoosh.query import Term

        return self._chunk_ids(Term("content", term), limit)

    def doc_frequency(self, term: str) -> int:
        """How many passages hold ``term`` (0: none)."""
        try:
            return int(self.searcher().doc_frequency("content", term))
        except Exception as err:
            raise IndexUnavailable(f"keyword index lookup failed: {err}") from err

    def _chunk_ids(self, query, limit: int) -> list[str]:
        try:
            s = self.searcher()
            out = []
            for docnum in s.docs_for_query(query):
                out.append(s.stored_fields(docnum)["chunk_id"])
                if len(out) >= limit:
                    break
            return out
        except Exception as err:
            raise IndexUnavailable(f"keyword search failed: {err}") from err

    def close(self) -> None:
        self._close_searcher()
        self.ix.close()
