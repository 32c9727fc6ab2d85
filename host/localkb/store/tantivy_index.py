"""The keyword side on tantivy: the same terms as the Whoosh index, the same BM25, 100x faster at scale.

tantivy never analyses our text. Each passage is indexed as exactly the ``(term,
position)`` pairs of ``analysis.analyze`` (identifiers whole, by qualified suffix and by
parts, stems, stopwords leaving their position empty), handed over pre-tokenized, so
positions, term frequencies and field lengths are the Whoosh index's, and several
terms can share a position (``il-6`` and ``il``) as they do there. Query terms come from
``analysis.plan_query`` and are looked up verbatim. Scoring is tantivy's BM25 (k1 1.2,
b 0.75, idf ``log(1 + (N - df + 0.5) / (df + 0.5))``): the parameters and the Lucene idf
our Whoosh weighting uses.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from pathlib import Path

from localkb.errors import IndexUnavailable
from localkb.store.analysis import analyze
from localkb.store.keywords import MAX_SEARCH_TERMS, EngineBase, KeywordHit, nonempty

#: The content field's tokenizer name. Text always arrives pre-tokenized; the whitespace
#: tokenizer registered under it is only there so that the index opens.
ANALYZER = "localkb_terms"
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

    ix.register_tokenizer(ANALYZER, tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.whitespace()).build())


def pre_tokenized(text: str):
    """``analyze(text)`` as tantivy tokens: each term at its own position, none re-analysed."""
    import tantivy

    token = tantivy.Token
    return tantivy.PreTokenizedString("", [token(term, pos, 0, 0) for term, pos in analyze(text)])


class TantivyIndex(EngineBase):
    """A tantivy index in its own folder plus ``<folder>.json`` with the generation it reflects."""

    engine = "tantivy"

    def __init__(self, folder: Path, ix) -> None:
        super().__init__(folder, ix)
        self.schema = ix.schema
        # True from ``create`` until the first commit: nothing to delete before an upsert.
        self._empty = False

    @classmethod
    def create(cls, folder: Path):
        ki = super().create(folder)
        ki._empty = True
        return ki

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
                    # A writer killed before its commit leaves the files it wrote (a segment's
                    # ``<segment>.<opstamp>.del``) unreferenced by ``meta.json``; this write
                    # would reach the same opstamps and fail to create the same name. tantivy
                    # sweeps them only after a commit: sweep them first. A sweep that fails
                    # is no failure of this write (if a stale file is still in the way, the
                    # commit below says so).
                    with contextlib.suppress(OSError, ValueError, RuntimeError):
                        writer.garbage_collect_files()
                    for cid in deletes:
                        writer.delete_documents_by_term("chunk_id", cid)
                    # A new index (a rebuild, an import) holds nothing to replace: a delete per
                    # passage is only needed for an id this write already added.
                    added: set[str] | None = set() if self._empty else None
                    for cid, content in upserts or ():
                        if added is None or cid in added:
                            writer.delete_documents_by_term("chunk_id", cid)
                        else:
                            added.add(cid)
                        doc = tantivy.Document(chunk_id=cid)
                        doc.add_pre_tokenized_text("content", pre_tokenized(content))
                        writer.add_document(doc)
                    writer.commit()
                    self._empty = False
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

        terms = terms[:MAX_SEARCH_TERMS]
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
        bit set of its terms (MAX_SEARCH_TERMS, 24 at most: exact in float32).
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

    def _phrase(self, terms: list[str], limit: int) -> list[str]:
        import tantivy

        return self._chunk_ids(tantivy.Query.phrase_query(self.schema, "content", terms), limit)

    def chunks_with(self, term: str, limit: int = 20_000) -> list[str]:
        """Chunk ids of (at most ``limit``) passages holding ``term``."""
        return self._chunk_ids(self._term(term), limit)

    def _chunk_ids(self, query, limit: int) -> list[str]:
        try:
            s = self.searcher()
            return [s.doc(addr)["chunk_id"][0] for _score, addr in s.search(query, limit, count=False).hits]
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
