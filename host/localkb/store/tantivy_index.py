"""The keyword side on tantivy: the same terms as the Whoosh index, the same BM25, 100x faster at scale.

tantivy never analyses our text. Each passage is indexed as the terms our own
analyser produces (``keywords.text_terms``: identifiers whole and by parts, stems,
stopwords dropped), written one per position into a field whose tokenizer only
splits on whitespace; a position our analyser leaves empty (a stopword) holds a
filler token that a stopword filter removes, so positions, term frequencies and
field lengths are exactly the Whoosh index's. Query terms come from
``keywords.query_terms`` and are looked up verbatim. Scoring is tantivy's BM25
(k1 1.2, b 0.75, idf ``log(1 + (N - df + 0.5) / (df + 0.5))``): the parameters and
the Lucene idf our Whoosh weighting uses.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path

from localkb.errors import IndexUnavailable
from localkb.store.keywords import _TOKEN as TOKEN
from localkb.store.keywords import (
    MAX_QUERY_TERMS,
    EngineBase,
    KeywordHit,
    index_terms,
    nonempty,
)

ANALYZER = "localkb_terms"
#: Stands for an empty position (a dropped stopword); removed before indexing, never a term.
FILLER = "\x00"
#: The writer's memory budget; tantivy flushes a segment when it is used up.
WRITER_HEAP = 64_000_000


def _schema():
    import tantivy

    sb = tantivy.SchemaBuilder()
    sb.add_text_field("chunk_id", stored=True, tokenizer_name="raw", index_option="basic")
    sb.add_text_field("content", stored=False, tokenizer_name=ANALYZER, index_option="position")
    return sb.build()


def _register(ix) -> None:
    import tantivy

    analyzer = (tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.whitespace())
                .filter(tantivy.Filter.custom_stopword([FILLER])).build())
    ix.register_tokenizer(ANALYZER, analyzer)


@lru_cache(maxsize=200_000)
def _piece(token: str) -> str:
    return " ".join(index_terms(token)) or FILLER


def term_stream(text: str) -> str:
    """``text_terms(text)`` as tantivy reads it: one term per position, a FILLER where one is empty.

    Built per token from the same ``index_terms`` (cached), so a passage costs one regex
    scan and a join; a test holds it equal to ``text_terms``.
    """
    return " ".join(map(_piece, TOKEN.findall(text)))


class TantivyIndex(EngineBase):
    """A tantivy index in its own folder plus ``<folder>.json`` with the generation it reflects."""

    engine = "tantivy"

    def __init__(self, folder: Path, ix) -> None:
        super().__init__(folder, ix)
        self.schema = ix.schema

    @staticmethod
    def _new(folder: Path):
        import tantivy

        ix = tantivy.Index(_schema(), path=str(folder), reuse=False)
        _register(ix)
        return ix

    @staticmethod
    def _open(folder: Path):
        import tantivy

        ix = tantivy.Index.open(str(folder))
        _register(ix)
        return ix

    def searcher(self):
        if self._searcher is None:
            self._searcher = self.ix.searcher()
        return self._searcher

    def doc_count(self) -> int:
        return self.searcher().num_docs

    def segment_count(self) -> int:
        return self.searcher().num_segments

    def write(self, upserts: Iterable[tuple[str, str]], deletes: list[str], generation: int) -> None:
        """Apply changes in one tantivy commit, then record the generation.

        ``upserts`` may be a generator (a big switch streams its passages through here).
        """
        import tantivy

        upserts = nonempty(upserts)
        if upserts is not None or deletes:
            try:
                writer = self.ix.writer(heap_size=WRITER_HEAP, num_threads=1)
                try:
                    for cid in deletes:
                        writer.delete_documents_by_term("chunk_id", cid)
                    for cid, content in upserts or ():
                        writer.delete_documents_by_term("chunk_id", cid)
                        writer.add_document(tantivy.Document(chunk_id=cid, content=term_stream(content)))
                    writer.commit()
                except BaseException:
                    writer.rollback()
                    raise
                # Merges run on the writer's threads; wait so the next open sees few segments.
                writer.wait_merging_threads()
            except (OSError, ValueError, RuntimeError) as err:
                raise IndexUnavailable(f"keyword index update failed: {err}") from err
            self.ix.reload()
            self._searcher = None
        self._save_meta(generation)

    # -- queries ---------------------------------------------------------------
    def _term(self, term: str):
        import tantivy

        return tantivy.Query.term_query(self.schema, "content", term, index_option="freq")

    def search(self, terms: list[str], limit: int) -> list[KeywordHit]:
        """BM25, any term may match (OR); each hit with the query terms it contains."""
        import tantivy

        terms = terms[:MAX_QUERY_TERMS]
        if not terms or limit <= 0:
            return []
        try:
            s = self.searcher()
            query = tantivy.Query.boolean_query([(tantivy.Occur.Should, self._term(t)) for t in terms])
            found = s.search(query, limit, count=False).hits
            if not found:
                return []
            ids = [s.doc(addr)["chunk_id"][0] for _score, addr in found]
            matched = self._matched(terms, ids)
            return [KeywordHit(cid, float(score), matched.get(cid, frozenset()))
                    for (score, _addr), cid in zip(found, ids, strict=True)]
        except (OSError, ValueError, RuntimeError) as err:
            raise IndexUnavailable(f"keyword search failed: {err}") from err

    def _matched(self, terms: list[str], ids: list[str]) -> dict[str, frozenset[str]]:
        """Which query terms each of ``ids`` contains, in one query.

        Among the given chunks, term i scores a constant 2**i, so a hit's score is the
        bit set of its terms (12 terms at most: exact in float32).
        """
        import tantivy

        s = self.searcher()
        only = tantivy.Query.const_score_query(
            tantivy.Query.term_set_query(self.schema, "chunk_id", ids), 0.0)
        bits = [(tantivy.Occur.Should, tantivy.Query.const_score_query(self._term(t), float(1 << i)))
                for i, t in enumerate(terms)]
        query = tantivy.Query.boolean_query([(tantivy.Occur.Must, only), *bits])
        out: dict[str, frozenset[str]] = {}
        for score, addr in s.search(query, len(ids), count=False).hits:
            mask = round(score)
            out[s.doc(addr)["chunk_id"][0]] = frozenset(t for i, t in enumerate(terms) if mask >> i & 1)
        return out

    def _phrase(self, terms: list[str], limit: int) -> list[KeywordHit]:
        import tantivy

        try:
            s = self.searcher()
            query = tantivy.Query.phrase_query(self.schema, "content", terms)
            return [KeywordHit(s.doc(addr)["chunk_id"][0], float(score), frozenset(terms))
                    for score, addr in s.search(query, limit, count=False).hits]
        except (OSError, ValueError, RuntimeError) as err:
            raise IndexUnavailable(f"keyword search failed: {err}") from err

    def doc_frequency(self, term: str) -> int:
        """Live passages containing ``term`` (0 means no passage mentions it)."""
        try:
            return self.searcher().search(self._term(term), 1, count=True).count
        except (OSError, ValueError, RuntimeError) as err:
            raise IndexUnavailable(f"keyword search failed: {err}") from err

    def close(self) -> None:
        self._searcher = None
        self.ix = None
