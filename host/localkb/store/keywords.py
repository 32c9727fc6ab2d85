"""The keyword side: a Whoosh BM25F index per knowledge base, and query terms.

Code-like tokens (``ERR_4521``, ``v2.3``, ``e-mail``, ``SKU-88-A``) are indexed
whole *and* as their parts, and a query asks for them only whole: ``ERR_4521``
never matches a page about ``ERR_4512`` through a shared piece, while a
query for ``mail`` still finds ``e-mail``. Plain words are lower-cased and
Porter-stemmed; English, French and German stopwords are dropped.
"""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from whoosh.analysis import Filter, RegexTokenizer

from localkb import __version__
from localkb.atomic import read_json, write_json
from localkb.errors import IndexUnavailable

MAX_QUERY_TERMS = 12
TOKEN_PATTERN = r"\w+(?:[-./:'’]\w+)*"  # noqa: S105 - a regex, not a password
_TOKEN = re.compile(TOKEN_PATTERN, re.UNICODE)
_JOINERS = re.compile(r"[-_./:'’]")


@lru_cache(maxsize=1)
def stopwords() -> frozenset[str]:
    from whoosh.lang import stopwords_for_language

    words: set[str] = set()
    for lang in ("en", "fr", "de"):
        words |= set(stopwords_for_language(lang))
    return frozenset(words)


@lru_cache(maxsize=100_000)
def _stem(word: str) -> str:
    from whoosh.lang.porter import stem

    return stem(word)


def is_code_like(token: str) -> bool:
    """Anything that is not a plain alphabetic word: it must match as a whole."""
    return not token.isalpha()


def is_identifier(term: str) -> bool:
    """An identifier (``err_4521``, ``v2.3``, ``sku-88-a``, ``il-6``): letters and digits, or an underscore.

    Hyphenated words (``non-small``) and bare numbers are code-like but not identifiers.
    """
    return "_" in term or (any(c.isdigit() for c in term) and any(c.isalpha() for c in term))


def normalize(token: str) -> str | None:
    """The indexed form of one token: lower case, stemmed if a plain word; None if a stopword."""
    low = token.lower()
    if low in stopwords():
        return None
    if is_code_like(low):
        return low
    return _stem(low)


@lru_cache(maxsize=200_000)
def index_terms(token: str) -> tuple[str, ...]:
    """Terms a document token is indexed under: the whole token first, then its parts."""
    whole = normalize(token)
    out = [whole] if whole else []
    if _JOINERS.search(token):
        for part in _JOINERS.split(token):
            norm = normalize(part) if part else None
            if norm and norm not in out:
                out.append(norm)
    return tuple(out)


def query_terms(query: str) -> list[str]:
    """Whole, normalised, de-duplicated query terms (at most 12); code-like terms never split."""
    terms: list[str] = []
    for token in _TOKEN.findall(query):
        norm = normalize(token.strip("'’"))
        if norm and norm not in terms:
            terms.append(norm)
        if len(terms) == MAX_QUERY_TERMS:
            break
    return terms


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


class CompoundFilter(Filter):
    """Whoosh filter emitting ``index_terms`` of each token (module level: Whoosh pickles it)."""

    def __call__(self, tokens):
        for t in tokens:
            for term in index_terms(t.text):
                t.text = term
                yield t


def _analyzer():
    return RegexTokenizer(TOKEN_PATTERN) | CompoundFilter()


def _schema():
    from whoosh.fields import ID, TEXT, Schema

    return Schema(chunk_id=ID(stored=True, unique=True),
                  content=TEXT(analyzer=_analyzer(), phrase=False))


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
            write_json(self.meta_path, {"generation": generation, "count": self.doc_count(),
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
        """BM25F, any term may match (OR)."""
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

    def close(self) -> None:
        self._close_searcher()
        self.ix.close()


def document_terms(text: str) -> list[tuple[str, int]]:
    """(term, position) of every term the keyword index stores for ``text``, from the same analyser.

    The team store builds its PostgreSQL ``tsvector`` from these, so both stores index
    exactly the same terms (compounds whole and by their parts, stems, no stopwords).
    """
    return [(t.text, t.pos) for t in _analyzer()(text, positions=True)]
