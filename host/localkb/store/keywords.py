"""The keyword side: a Whoosh BM25F index per knowledge base.

What a passage is indexed under (terms and positions) and what a query asks for come
from ``analysis.py``, which knows no engine; this module only maps those terms onto
Whoosh: an OR query scored by BM25F with the terms each hit matched, an adjacent-phrase
query, and "which passages hold this term". The other engine (tantivy_index.py) indexes
the same ``analyze`` pairs and implements the same four calls (``search``, ``phrase``,
``doc_frequency``, ``chunks_with``) on the same terms; ``keyword_engine.py`` chooses.
"""

from __future__ import annotations

import itertools
import shutil
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from localkb import __version__
from localkb.atomic import read_json, write_json
from localkb.errors import IndexUnavailable
from localkb.store.analysis import analyze

#: What the saved index was analysed with; an index of another schema is rebuilt from the
#: catalogue on open (2: positions, qualified suffixes, version terms; 3: the
#: tantivy engine indexes the same analysis, several terms at one position; 4: a trailing
#: possessive is no part of a token, and an abbreviation is never a stopword; 5: a
#: backslash that opens a word is part of the name, ``\\copy``).
SCHEMA = 5
#: At most this many terms are scored in one OR query (a bit each records which a hit holds).
MAX_SEARCH_TERMS = 24


@lru_cache(maxsize=1)
def _weighting():
    """BM25F with the idf of Lucene's BM25, ``log(1 + (N - df + 0.5) / (df + 0.5))``.

    Whoosh's own idf, ``log(N / (df + 1)) + 1``, never falls below about 1, so a word
    in every passage still counts a tenth of the rarest one; on a long question its
    common words then outvote the telling ones. SciFact keyword nDCG@10 0.651 -> 0.656
    with this idf (fresh build, passages of 96 tokens), hybrid unchanged (DESIGN.md "BM25 idf").
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


def __getattr__(name: str):
    # ``AnalysisTokenizer`` is made on first use: Whoosh's analysis and index modules are
    # imported only where a Whoosh index is used, never by a tantivy knowledge base (the
    # analyser's stopwords and stemmer, whoosh.lang, are light). Unpickling a Whoosh schema
    # asks for the class here.
    if name == "AnalysisTokenizer":
        return _analysis_tokenizer()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@lru_cache(maxsize=1)
def _analysis_tokenizer() -> type:
    from whoosh.analysis import Token, Tokenizer

    class AnalysisTokenizer(Tokenizer):
        """Whoosh tokens from ``analysis.analyze`` (reachable as this module's attribute:
        Whoosh pickles it with the schema, by name)."""

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

    AnalysisTokenizer.__module__, AnalysisTokenizer.__qualname__ = __name__, "AnalysisTokenizer"
    globals()["AnalysisTokenizer"] = AnalysisTokenizer
    return AnalysisTokenizer


def _schema():
    from whoosh.fields import ID, TEXT, Schema

    # Positions are stored so that a phrase (terms at consecutive positions) can be asked for.
    return Schema(chunk_id=ID(stored=True, unique=True),
                  content=TEXT(analyzer=_analysis_tokenizer()(), phrase=True))


@dataclass
class KeywordHit:
    chunk_id: str
    bm25: float
    terms: frozenset[str]  # the query terms this chunk contains

    @property
    def matched(self) -> int:
        return len(self.terms)


def nonempty(upserts: Iterable[tuple[str, str]]) -> Iterator[tuple[str, str]] | None:
    """``upserts`` as one iterator over all of them, or None when there are none.

    Every engine's ``write`` takes a list or a generator (a big switch streams its
    passages); a generator can be read only once, so its first item is looked at here
    and put back in front.
    """
    it = iter(upserts)
    first = next(it, None)
    return None if first is None else itertools.chain((first,), it)


#: Segments of one size tier (a factor of 4 in passages) that are merged into one.
MERGE_FACTOR = 4


def merge_tiers(writer, segments):
    """Whoosh merge policy: MERGE_FACTOR segments of one size tier are merged, so is one a third deleted.

    Every write adds a segment, and every query walks them all (12 at 300,000 passages
    under Whoosh's own policy). Merging a tier when it fills keeps at most
    MERGE_FACTOR - 1 segments per factor of 4 in size and merges each passage about
    log4(N) times over its life; a one-note write merges only the small segments.
    """
    from math import log

    from whoosh.reading import SegmentReader

    def tier(seg) -> int:
        return int(log(max(seg.doc_count_all(), 1), MERGE_FACTOR))

    tiers: dict[int, list] = {}
    for seg in segments:
        tiers.setdefault(tier(seg), []).append(seg)
    full = [t for t, segs in sorted(tiers.items()) if len(segs) >= MERGE_FACTOR]
    upto = full[0] if full else -1
    merge = [seg for seg in segments
             if tier(seg) <= upto or seg.deleted_count() * 3 > seg.doc_count_all()]
    if len(merge) < 2 and not any(seg.deleted_count() * 3 > seg.doc_count_all() for seg in merge):
        return segments
    for seg in merge:
        reader = SegmentReader(writer.storage, writer.schema, seg)
        writer.add_reader(reader)
        reader.close()
    return [seg for seg in segments if seg not in merge]


def fresh_folder(folder: Path) -> None:
    """An empty folder for a new index (what was there is derived: it goes)."""
    if folder.is_dir():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)


def saved_meta(folder: Path, engine: str) -> dict:
    """``<folder>.json`` of a saved index of ``engine``; ``IndexUnavailable`` when there is none."""
    meta = read_json(folder.with_suffix(".json"))
    if meta is None or not folder.exists() or meta.get("engine", "whoosh") != engine:
        raise IndexUnavailable(f"no {engine} keyword index at {folder.name}")
    return meta


class EngineBase:
    """What both keyword engines share: an index in its own folder, ``<folder>.json`` beside it
    with the generation it reflects, and the phrase operation (one term is a term search)."""

    def __init__(self, folder: Path, ix) -> None:
        self.folder = folder
        self.meta_path = folder.with_suffix(".json")
        self.ix = ix
        self.generation = -1
        self._searcher = None

    @classmethod
    def create(cls, folder: Path):
        """A new, empty index in ``folder`` (whatever was there goes)."""
        try:
            fresh_folder(folder)
            ki = cls(folder, cls._new(folder))
        except (OSError, ValueError) as err:
            raise IndexUnavailable(f"keyword index {folder.name} could not be created: {err}") from err
        ki.generation = 0
        return ki

    @classmethod
    def load(cls, folder: Path):
        """The saved index in ``folder``; ``IndexUnavailable`` if absent, unreadable or another engine's."""
        meta = saved_meta(folder, cls.engine)
        if meta.get("schema", 1) != SCHEMA:
            raise IndexUnavailable(f"keyword index {folder.name} was analysed with schema "
                                   f"{meta.get('schema', 1)}, not {SCHEMA}: it is rebuilt on open")
        try:
            ki = cls(folder, cls._open(folder))
        except Exception as err:
            raise IndexUnavailable(f"keyword index {folder.name} could not be read: {err}") from err
        ki.generation = int(meta.get("generation", -1))
        return ki

    def _save_meta(self, generation: int) -> None:
        """Record the generation the index now reflects (after its commit)."""
        try:
            write_json(self.meta_path, {"engine": self.engine, "generation": generation,
                                        "schema": SCHEMA, "count": self.doc_count(),
                                        "segments": self.segment_count(), "saved": time.time(),
                                        "localkb": __version__})
        except OSError as err:
            raise IndexUnavailable(f"keyword index {self.folder.name} could not be saved: {err}") from err
        self.generation = generation

    def phrase(self, terms: tuple[str, ...] | list[str], limit: int = 1000) -> list[str]:
        """Chunk ids of passages holding ``terms`` at adjacent positions, in order (one term: holding it)."""
        if not terms or limit <= 0:
            return []
        if len(terms) == 1:
            return self.chunks_with(terms[0], limit)
        return self._phrase(list(terms), limit)


def _storage(folder: Path):
    """The index folder as Whoosh storage, read through the file, never through ``mmap``.

    With ``mmap`` Whoosh's compound segment hands each reader a ``BytesIO`` of its part of
    the map, which copies it: every reader opened (the searcher, and a writer's own for its
    deletions) held a private copy of the terms and postings, 2x the index in memory for a
    one-note write (~150 MB at 30,000 passages). Read through the file, a reader opens in
    O(1) and reads only the blocks a query or a merge asks for; the term-at-a-time scorer
    keeps the postings it decoded (whoosh_scoring.py), so warm queries are unchanged.
    """
    from whoosh.filedb.filestore import FileStorage

    return FileStorage(str(folder), supports_mmap=False)


class KeywordIndex(EngineBase):
    """Whoosh index in its own folder plus ``<folder>.json`` with the generation it reflects."""

    engine = "whoosh"

    def __init__(self, folder: Path, ix) -> None:
        super().__init__(folder, ix)
        self._taat = None

    @staticmethod
    def _new(folder: Path):
        return _storage(folder).create_index(_schema())

    @staticmethod
    def _open(folder: Path):
        return _storage(folder).open_index()

    def doc_count(self) -> int:
        """Live passages, from the open searcher (``Index.doc_count`` re-reads the TOC each call)."""
        return self.searcher().doc_count()

    def segment_count(self) -> int:
        return len(list(self.searcher().reader().leaf_readers()))

    def write(self, upserts: Iterable[tuple[str, str]], deletes: list[str], generation: int) -> None:
        """Apply changes in one Whoosh commit, then record the generation.

        ``upserts`` may be a generator (a big switch streams its passages through here).
        """
        upserts = nonempty(upserts)
        if upserts is not None or deletes:
            try:
                writer = self.ix.writer(limitmb=128)
                try:
                    for cid in deletes:
                        writer.delete_by_term("chunk_id", cid)
                    for cid, content in upserts or ():
                        writer.update_document(chunk_id=cid, content=content)
                except BaseException:
                    writer.cancel()
                    raise
                writer.commit(mergetype=merge_tiers)
            except Exception as err:
                raise IndexUnavailable(f"keyword index update failed: {err}") from err
        self._save_meta(generation)
        self._close_searcher()

    def _close_searcher(self) -> None:
        if self._searcher is not None:
            self._searcher.close()
            self._searcher = self._taat = None

    def searcher(self):
        """The open searcher; a write closes it, and another process's write reloads this index."""
        if self._searcher is None:
            from localkb.store.whoosh_scoring import TermAtATime

            self._searcher = self.ix.searcher(weighting=_weighting())
            self._taat = TermAtATime(self._searcher)
        return self._searcher

    def search(self, terms: list[str], limit: int) -> list[KeywordHit]:
        """BM25F, any term may match (OR); scored term at a time (whoosh_scoring.py)."""
        terms = terms[:MAX_SEARCH_TERMS]
        if not terms or limit <= 0:
            return []
        try:
            searcher = self.searcher()
            return [KeywordHit(searcher.stored_fields(doc)["chunk_id"], score,
                               frozenset(t for i, t in enumerate(terms) if mask >> i & 1))
                    for doc, score, mask in self._taat.search(terms, limit)]
        except Exception as err:
            raise IndexUnavailable(f"keyword search failed: {err}") from err

    def search_matchers(self, terms: list[str], limit: int) -> list[KeywordHit]:
        """The same OR query through Whoosh's own matchers and collector (the benches compare)."""
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

    def _phrase(self, terms: list[str], limit: int) -> list[str]:
        from whoosh.query import Phrase

        return self._chunk_ids(Phrase("content", terms), limit)

    def chunks_with(self, term: str, limit: int = 20_000) -> list[str]:
        """Chunk ids of (at most ``limit``) passages holding ``term``."""
        from whoosh.query import Term

        return self._chunk_ids(Term("content", term), limit)

    def doc_frequency(self, term: str) -> int:
        """Live passages holding ``term`` (0: none).

        Whoosh's own count includes deleted passages until their segment is merged; with
        deletions the live ones are counted from the term's postings (whoosh_scoring.py).
        """
        try:
            s = self.searcher()
            df = int(s.doc_frequency("content", term))
            if df and s.reader().has_deletions():
                df = self._taat.live_frequency(term)
            return df
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
