"""One usearch index per knowledge base, for that knowledge base's model: a base file,
level-1 segment files and an append log.

The base file (``vectors-<model>.usearch``) is an HNSW index saved at some catalogue
generation and opened memory-mapped (``Index.view``): opening it costs no read of the
vectors, and only the pages a search touches become resident. Every later write appends
one batch of upserts and deletes to ``vectors-<model>.log`` and costs what it writes,
not what the knowledge base holds (a full save of 300,000 vectors rewrote ~500 MB for
one small note). Readers apply the log over the files: the changed vectors are searched
exactly beside them, and the older copies of changed or deleted keys are set aside.

When the log outgrows ``fold_threshold`` (at most 4,096 changes) it is folded into a new
flat segment (``vectors-<model>.seg<N>.flat``: the keys, then the vectors, searched exactly;
``.seg<N>.gone``: the keys they delete), memory-mapped like the base and searched beside
it. A fold costs what was logged, not what the base holds: it wrote no graph (it loaded and
rewrote the whole base: 28-71 s and 709-784 MB for a full log at 300,000 passages on the
loaded machine). A long write applied in groups (a big source's switch) spills its changes to
flat segments as it goes (``spill``), so it holds one spill's vectors, not all it writes. The
write only folds: merges and base rewrites are ``compact``'s, built
outside the store lock from the listed files and swapped in under it (a new ``layout``).
FANOUT segments of one size tier merge into one HNSW segment of the next
(``.seg<N>.usearch``; never past a quarter of the base: the write that builds a graph of
four folds' vectors), and once the segments together hold as many vectors as the base, or a
merge would leave a search more than ``MAX_GRAPH_SEGMENTS`` graphs to walk beside the base,
all is written as one new base: the one write whose cost is the knowledge base's size, paid
after at least ``MAX_GRAPH_SEGMENTS + 1`` merges' worth of changes (100,000 passages: every
~37,500; 300,000: every ~49,000).

A rebuild from the catalogue (an import's first open) writes no graph: ``build_flat`` streams
the vectors into a flat base (``.seg<N>.flatbase``: the vectors, then the keys), listed with
``base_graph`` false and searched exactly, and ``compaction_plan`` says ``graph`` until
``compact`` builds its HNSW graph (half of an import's time, now off its path).

Metadata beside the files (``.json``) lists the base file's generation and count and each
segment's; replacing it commits a fold (files not listed are orphans of a crash, removed by
the next fold). A log batch carries its generation and a CRC; a torn tail (a crash
mid-append) is ignored on read and cut off by the next append.
"""

from __future__ import annotations

import os
import struct
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from localkb import __version__
from localkb.atomic import read_json, replace_into, tmp_path_for, write_json
from localkb.errors import IndexUnavailable, ModelMismatch
from localkb.locks import try_lock, unlock
from localkb.store.listing import vector_file

#: HNSW search expansion per candidate requested (see VectorIndex.search).
EXPANSION_PER_CANDIDATE = 8
#: The same for a segment: its candidates only add to the base's. With real MiniLM vectors
#: (SciFact: a 20,000-vector base and a 13,094-vector segment, 200 held-out queries, top 40)
#: recall of the exact top 40 is 0.9990 at 8, 0.9986 at 4, 0.9985 at 2, against 0.9991 for
#: one base of all of them; the search took 4.4, 3.3 and 2.7 ms against 1.6-1.9 ms.
SEGMENT_EXPANSION_PER_CANDIDATE = 4
_BATCH = struct.Struct("<4sQI")  # magic, generation, records
_MAGIC = b"LKV1"
_UPSERT, _DELETE = 1, 2
_GONE, _DELTA = -1, -2  # ``VectorIndex.owner``: deleted, or changed since the files (in ``delta``)
#: Segments of one size tier merged into one of the next (see ``VectorIndex.fold``).
FANOUT = 4
#: Merged (HNSW) segments a search may have to walk beside the base: the merge that would make
#: one more rewrites the base instead. Each is a walk of its own: at 100,000 passages (load
#: 8-11) the vector leg's top 40 took p50 106 ms with the seven that could pile up below
#: ~300,000 (merges are capped at a quarter of the base), 25 ms for the base alone.
MAX_GRAPH_SEGMENTS = 2
#: Flat segments a write may leave before it compacts inline (the backstop when compaction has
#: not run: ``compact`` is meant to run beside the writes, see ``VectorIndex.fold``). Each flat
#: segment of at most 4,096 vectors is one exact scan per search; the figures are in RESULTS.md.
MAX_FLAT_SEGMENTS = 12
#: Changed vectors a long write (a big source's switch, a catch-up: ``KnowledgeBase._apply``)
#: holds in memory before it spills them to a flat segment (``VectorIndex.spill``): 8,192 of
#: 384 dims are 12.6 MB (one ``APPLY_COMMIT`` group more may come before the check). The 30 MB
#: text file's switch held all 77,159 of its vectors, then copied them twice to write one
#: segment: a peak of 886 MB beside the model, against a 600 MB bound; 592 MB once it spilled
#: every 16,384 without the copies (``bench/ingest.py --big-text-mb 30``).
SPILL_ROWS = 8_192
#: Vectors of a flat base added to its graph at a time by compaction (``plan`` ``graph``): the
#: memory-mapped rows are copied in slices (65,536 of 384 dims: 100 MB), not all at once.
GRAPH_PART = 65_536
_OPEN_ATTEMPTS = 8  # listings swapped under one open before it gives up (each swap is a whole compaction)


def fold_threshold(base_count: int) -> int:
    """Changed vectors the log may hold before it is folded into a segment.

    1/32 of the base, at least 1,024 and at most 4,096: the exact search over the log's
    vectors stays ~1 ms, and a fold writes a flat segment of at most ~4,096 vectors, whatever
    the base holds (a fold into the base rewrote all of it: 28-71 s and 709-784 MB for a full
    log at 300,000 passages on the loaded machine).
    """
    return max(1024, min(base_count // 32, 4096))


@dataclass
class VectorHits:
    keys: np.ndarray  # uint64 vector keys, best first
    similarities: np.ndarray  # cosine similarity
    exact: bool


def _index_class():
    # usearch 2.26's extension, loaded before onnxruntime, makes the later
    # onnxruntime import segfault (seen here with onnxruntime 1.32); loading
    # onnxruntime first is harmless and avoids it in every process.
    import onnxruntime  # noqa: F401
    from usearch.index import Index

    return Index


#: HNSW build expansion. 64, not usearch's 128: on 8,000 real MiniLM passage vectors the graph
#: builds 2.7x faster (median of 3 interleaved rounds) and finds 0.9992 of the exact top 32 at
#: the search's expansion (1.0000 at 128); f16 or i8 storage was measured too (bench/hnsw_build.py).
EXPANSION_ADD = 64


def _new_index(dim: int):
    return _index_class()(ndim=dim, metric="cos", dtype="f32", connectivity=16,
                          expansion_add=EXPANSION_ADD, expansion_search=64)


class _Segment:
    """One level-1 segment, immutable once listed: the vectors one fold (or merge) wrote and the
    keys it deletes from older levels (``.gone``, raw uint64), memory-mapped.

    A fold's segment is flat (``.flat``: its keys, then its vectors; searched exactly, by the
    kernel ``Changed`` uses): writing it costs what was logged and no graph. A merge writes an
    HNSW index (``.usearch``), the graph built once per FANOUT folds' worth of vectors.
    """

    __slots__ = ("count", "generation", "gone", "graph", "index", "keys", "seq", "vectors")

    def __init__(self, seq: int, count: int, gone: int, generation: int, *, graph: bool) -> None:
        self.seq, self.count, self.gone, self.generation = seq, count, gone, generation
        self.graph = graph
        self.index = None  # usearch view (graph)
        self.keys = np.zeros(0, dtype=np.uint64)
        self.vectors = None  # memory-mapped (flat)

    def meta(self) -> dict:
        return {"seq": self.seq, "count": self.count, "gone": self.gone, "generation": self.generation,
                "graph": self.graph}

    def get(self, mask: np.ndarray, dim: int) -> np.ndarray:
        """The vectors of the keys ``mask`` selects, in key order."""
        if self.graph:
            return np.asarray(self.index.get(self.keys[mask]), dtype=np.float32).reshape(-1, dim)
        return np.asarray(self.vectors[mask], dtype=np.float32)


@dataclass
class _Matches:
    keys: np.ndarray
    distances: np.ndarray


class _FlatBase:
    """A base listed without a graph (a rebuild's, ``VectorIndex.build_flat``): its vectors, then
    their keys (``.seg<N>.flatbase``), memory-mapped and searched exactly, by the kernel flat
    segments use, until compaction builds its graph (the plan ``graph``).

    The part of usearch's ``Index`` a base is used through: ``len``, ``contains`` and an exact
    ``search``. Building the graph was half of an import (py-spy, 10,000 passages: 52 %).
    """

    def __init__(self, path: Path, count: int, dim: int) -> None:
        if path.stat().st_size != count * (4 * dim + 8):
            raise IndexUnavailable(f"vector base {path.name} does not match its metadata")
        self.ndim = dim
        self.vectors = np.memmap(path, dtype="<f4", mode="r", shape=(count, dim))
        self.keys = np.memmap(path, dtype="<u8", mode="r", offset=4 * dim * count, shape=(count,))
        self._sorted: np.ndarray | None = None  # for ``contains``, sorted on first use

    def __len__(self) -> int:
        return len(self.keys)

    def contains(self, keys):
        if self._sorted is None:
            self._sorted = np.sort(np.asarray(self.keys, dtype=np.uint64))
        want = np.atleast_1d(np.asarray(keys, dtype=np.uint64))
        at = np.minimum(np.searchsorted(self._sorted, want), len(self._sorted) - 1)
        found = self._sorted[at] == want
        return found if np.ndim(keys) else bool(found[0])

    def search(self, query: np.ndarray, count: int, *, exact: bool = True) -> _Matches:
        # Every core: this is one scan of the whole knowledge base (300,000 of 384 dims: 121 ms
        # median on one of this machine's two cores, 70 ms on both), only until the graph is built.
        keys, distances = _exact_top(self.vectors, self.keys, query, count, threads=0)
        return _Matches(np.asarray(keys, dtype=np.uint64), distances)


def _exact_top(vectors, keys, query: np.ndarray, count: int, *,
               threads: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """The exact top ``count`` rows of ``vectors`` by cosine (usearch's exact kernel, the one
    its exact index search uses): their ``keys`` and cosine distances."""
    _index_class()  # onnxruntime before usearch's extension (see there)
    from usearch.index import MetricKind
    from usearch.index import search as exact_search

    found = exact_search(vectors, np.asarray(query, dtype=np.float32), count, MetricKind.Cos,
                         exact=True, threads=threads)
    return keys[np.asarray(found.keys, dtype=np.int64)], np.asarray(found.distances, np.float32)


class VectorIndex:
    """A usearch HNSW base file and level-1 segment files (memory-mapped), plus an append log."""

    def __init__(self, path: Path, model: str, dim: int) -> None:
        self.path = path
        self.meta_path = path.with_suffix(".json")
        self.log_path = path.with_suffix(".log")
        self.model = model
        self.dim = dim
        self.generation = 0
        self._reset()
        self.base_generation = 0  # the generation the files (base and segments) hold; the log adds to it
        self._next_seq = 1
        self._pending: list[tuple[int, int, np.ndarray | None]] = []  # not yet in the log
        self._pending_count = 0  # changes since the last save (``_pending`` is emptied once a fold is due)
        self._log_end = 0  # bytes of whole batches in the log
        self._log_records = 0
        self.base_file = path  # the listed base file (a compaction's rewrite names a new one)
        self.base_id = ""  # which base: a rebuild or a rewrite writes a new one
        self.layout = 0  # bumped by every compaction (and rebuild): the files changed, the content not
        self._listing_stat: tuple[int, int, int] | None = None

    def _reset(self) -> None:
        self.base = None  # usearch Index (a view of the base file), or None when it holds nothing
        self.base_graph = True  # False: a rebuild's flat base (``_FlatBase``), its graph not built yet
        self.base_count = 0
        self.segments: list[_Segment] = []  # oldest first; level i + 1
        self.delta = Changed(self.dim)  # vectors changed since the files (in memory, searched exactly)
        # Every key a segment or a later change mentions -> the level holding its live vector
        # (0 the base, i segment i, _DELTA) or _GONE; a key it does not hold is the base's.
        self.owner: dict[int, int] = {}
        self._base_shadowed = 0  # base keys ``owner`` moved elsewhere or deleted
        self._segment_live = 0  # keys whose live vector a segment holds
        self._gone_since: set[int] = set()  # keys deleted since the files: the next segment's ``.gone``

    def _segment_path(self, seq: int, suffix: str) -> Path:
        return self.path.with_name(f"{self.path.stem}.seg{seq}{suffix}")

    # -- opening ---------------------------------------------------------------
    @classmethod
    def load(cls, path: Path, model: str, dim: int) -> VectorIndex:
        """Open the saved index; raise ``IndexUnavailable`` if absent, corrupt or not ours.

        Safe without the store lock: a compaction in another process may swap the files
        between the read of the listing and the mapping of the files it names (and delete
        those). A file missing under a listing that changed meanwhile is that swap, not damage:
        the open starts again from the new listing (the files, once mapped, stay readable).
        """
        meta_path = path.with_suffix(".json")
        for attempt in range(_OPEN_ATTEMPTS):
            stat = _stat_key(meta_path)  # before the read: a newer listing is noticed
            meta = read_json(meta_path)
            try:
                if meta is None or not path.with_name(meta.get("base", path.name)).exists():
                    raise IndexUnavailable(f"no vector index at {path.name}")
                if meta.get("model") != model or meta.get("dim") != dim:
                    raise ModelMismatch(
                        f"vector index {path.name} holds {meta.get('model')} ({meta.get('dim')}-d), "
                        f"the knowledge base uses {model} ({dim}-d)")
                vi = cls(path, model, dim)
                vi._open_files(meta)
            except IndexUnavailable:
                if attempt + 1 < _OPEN_ATTEMPTS and _stat_key(meta_path) != stat:
                    continue  # swapped under this open: read the listing that replaced it
                raise
            vi._listing_stat = stat
            vi._read_log()
            return vi
        raise AssertionError("unreachable")

    def _open_files(self, meta: dict) -> None:
        """The base and the segments ``meta`` lists, memory-mapped; ``owner`` from the segments."""
        self._reset()
        self.base_file = self.path.with_name(str(meta.get("base", self.path.name)))
        self.base_id = str(meta.get("base_id", ""))
        self.layout = int(meta.get("layout", 0))
        try:
            if meta.get("base_graph", True):
                base = _new_index(self.dim)
                base.view(str(self.base_file))
            else:
                self.base_graph = False
                base = _FlatBase(self.base_file, int(meta.get("count", 0)), self.dim)
            if base.ndim != self.dim or len(base) != meta.get("count"):
                raise IndexUnavailable(f"vector index {self.path.name} does not match its metadata")
            self.base, self.base_count = (base if len(base) else None), len(base)
            for s in meta.get("segments", []):
                seg = _Segment(int(s["seq"]), int(s["count"]), int(s["gone"]), int(s["generation"]),
                               graph=bool(s.get("graph", True)))
                gone = np.fromfile(self._segment_path(seg.seq, ".gone"), dtype="<u8")
                if len(gone) != seg.gone:
                    raise IndexUnavailable(f"vector segment {seg.seq} does not match its metadata")
                self._own(gone.tolist(), _GONE)
                self._view_segment(seg)
                self._own(seg.keys.tolist(), len(self.segments) + 1)
                self.segments.append(seg)
        except IndexUnavailable:
            raise
        except Exception as err:
            raise IndexUnavailable(f"vector index {self.path.name} could not be read: {err}") from err
        self._gone_since = set()
        self._next_seq = int(meta.get("next_seq", 1))
        self.base_generation = self.generation = int(meta.get("generation", -1))
        self._log_end = self._log_records = 0

    def _read_log(self) -> None:
        """Apply the log's whole batches newer than the files; stop at a torn tail."""
        try:
            data = self.log_path.read_bytes()
        except FileNotFoundError:
            return
        except OSError as err:
            raise IndexUnavailable(f"vector log {self.log_path.name} could not be read: {err}") from err
        size = _record_dtype(self.dim).itemsize
        off = 0
        while off + _BATCH.size <= len(data):
            magic, gen, n = _BATCH.unpack_from(data, off)
            end = off + _BATCH.size + n * size + 4
            if magic != _MAGIC or end > len(data):
                break
            body = data[off + 4 : end - 4]
            if zlib.crc32(body) != struct.unpack_from("<I", data, end - 4)[0]:
                break
            if gen > self.base_generation:
                self._apply_records(np.frombuffer(data, dtype=_record_dtype(self.dim), count=n,
                                                  offset=off + _BATCH.size))
                self.generation = gen
            self._log_records += n
            off = end
        self._log_end = off

    def _apply_records(self, records: np.ndarray) -> None:
        # Each record sets or deletes one key, so the batch's last word on a key is its effect.
        final: dict[int, np.ndarray | None] = {}
        for op, key, vec in zip(records["op"].tolist(), records["key"].tolist(), records["vec"],
                                strict=True):
            final[key] = vec if op == _UPSERT else None
        ups = [k for k, v in final.items() if v is not None]
        self._drop(np.array([k for k, v in final.items() if v is None], dtype=np.uint64))
        if ups:
            self._set(np.array(ups, dtype=np.uint64), np.stack([final[k] for k in ups]))

    # -- membership ------------------------------------------------------------
    def _own(self, keys: list[int], where: int) -> None:
        """Record that ``keys`` now live in level ``where`` (or in ``delta``, or are gone).

        A key no file holds needs no entry for a change (``delta`` alone says it is live), so
        a write of new passages adds nothing here.
        """
        owner = self.owner
        fresh = [k for k in dict.fromkeys(keys) if k not in owner]
        in_base: set[int] = set()
        if fresh and self.base is not None:
            held = np.atleast_1d(np.asarray(self.base.contains(np.array(fresh, dtype=np.uint64)), bool))
            in_base = set(np.array(fresh, dtype=np.uint64)[held].tolist())
            self._base_shadowed += len(in_base)
        for k in keys:
            old = owner.get(k)
            if old is None and where <= 0 and k not in in_base:
                continue
            if old is not None and old > 0:
                self._segment_live -= 1
            owner[k] = where
            if where > 0:
                self._segment_live += 1

    def _set(self, keys: np.ndarray, vectors: np.ndarray) -> None:
        self.delta.put(keys, vectors)
        self._own(keys.tolist(), _DELTA)

    def _drop(self, keys: np.ndarray) -> None:
        if not len(keys):
            return
        in_delta = self.delta.contains(keys)
        self.delta.remove(keys[in_delta])
        listed = keys.tolist()
        self._own(listed, _GONE)
        self._gone_since.update(listed)

    def __len__(self) -> int:
        return self.base_count - self._base_shadowed + self._segment_live + len(self.delta)

    def contains(self, key: int) -> bool:
        at = self.owner.get(int(key))
        if at is None:
            return bool(self.delta.contains(np.array([key], dtype=np.uint64))[0]) or (
                self.base is not None and bool(self.base.contains(int(key))))
        return at != _GONE

    # -- changes ---------------------------------------------------------------
    def upsert(self, keys: np.ndarray, vectors: np.ndarray) -> None:
        if len(keys) == 0:
            return
        if vectors.shape[1] != self.dim:
            raise ModelMismatch(f"vectors of {vectors.shape[1]} dims for a {self.dim}-d index")
        keys = np.asarray(keys, dtype=np.uint64)
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        self._set(keys, vectors)
        self._note([(_UPSERT, k, v) for k, v in zip(keys.tolist(), vectors, strict=True)])

    def remove(self, keys: np.ndarray) -> None:
        keys = np.asarray(keys, dtype=np.uint64)
        self._drop(keys)
        self._note([(_DELETE, k, None) for k in keys.tolist()])

    def _fold_due(self) -> bool:
        return self._log_records + self._pending_count > fold_threshold(self.base_count)

    def _note(self, records: list[tuple[int, int, np.ndarray | None]]) -> None:
        """Keep changes for the next append, until so many came that the next save folds.

        A fold writes ``delta`` and the keys gone, never the pending records, so from then on
        they are dropped: a big write (a staged switch catching up in slices) holds its
        vectors once, in ``delta``, not a second time as records to append.
        """
        self._pending_count += len(records)
        if self._fold_due():
            self._pending.clear()
        else:
            self._pending += records

    def save(self, generation: int) -> None:
        """Append the changes since the last save as one batch (fsynced); fold when the log is due."""
        with self._saving():
            if self._fold_due():
                self.fold(generation)
                return
            if not self.meta_path.exists():  # a new index: an empty base (older than any batch) first
                self._write_base(None, -1)
                self._write_meta(-1, 0, [])
                self._empty_log()
            self._append(generation)
        self.generation = generation

    @contextmanager
    def _saving(self):
        """A write of the index's files: an OS or usearch error is the index's ``IndexUnavailable``."""
        try:
            yield
        except (OSError, RuntimeError) as err:
            raise IndexUnavailable(f"vector index {self.path.name} could not be saved: {err}") from err

    def _append(self, generation: int) -> None:
        records = np.zeros(len(self._pending), dtype=_record_dtype(self.dim))
        for i, (op, key, vec) in enumerate(self._pending):
            records[i]["op"] = op
            records[i]["key"] = key
            if vec is not None:
                records[i]["vec"] = vec
        body = _BATCH.pack(_MAGIC, generation, len(records))[4:] + records.tobytes()
        blob = _MAGIC + body + struct.pack("<I", zlib.crc32(body))
        fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            os.ftruncate(fd, self._log_end)  # a torn tail from a crash goes first
            os.lseek(fd, self._log_end, os.SEEK_SET)
            os.write(fd, blob)
            os.fsync(fd)
        finally:
            os.close(fd)
        self._log_end += len(blob)
        self._log_records += len(records)
        self._pending.clear()
        self._pending_count = 0

    # -- folding ---------------------------------------------------------------
    def spill_bound(self, planned: int) -> int:
        """How many changed vectors a write of ``planned`` changes holds before it spills.

        ``SPILL_ROWS``, or more when spills that size would leave more than
        ``MAX_FLAT_SEGMENTS`` flat segments beside those listed now (the write's last fold
        counted): a big switch must not set off the backstop's inline compaction, a base
        rewrite in the adding process, where the segments it leaves would have been merged
        by compaction after it. With the segments already at the limit it is ``planned``:
        one fold, as a write was before spills.
        """
        free = MAX_FLAT_SEGMENTS - sum(not s.graph for s in self.segments) - 1
        return max(SPILL_ROWS, -(-planned // free)) if free > 0 else max(planned, 1)

    def spill(self, at: int) -> None:
        """Fold the changes held so far into a flat segment, at the generation the index already
        has, once there are ``at`` of them (``spill_bound``).

        For a write applied in groups (``KnowledgeBase._apply``, after the catalogue committed
        all of it): memory holds one spill's vectors, not the write's. The listing keeps the
        old generation: a write that stops after a spill (a kill, a full disk) leaves an index
        the next open catches up from the change log, and its upserts and deletes are
        idempotent. No backstop compaction here: the write's last save decides that, once.
        """
        if len(self.delta) >= at:
            with self._saving():
                self.fold(self.generation, backstop=False)

    def fold(self, generation: int, *, backstop: bool = True) -> None:
        """Write the changes since the files as a new flat segment at ``generation`` and start an
        empty log.

        The segment holds what was written (the changed vectors and the keys deleted), so the
        fold costs that, not what the base holds. Merging segments and rewriting the base are
        ``compact``'s, which runs beside the writes (the host's thread, a detached
        ``localkb kb compact --auto``); only when it has not run for so long that more than
        ``MAX_FLAT_SEGMENTS`` flat segments pile up does the write compact inline, so a search
        never walks more than that many.
        """
        keys, vectors = self.delta.view()  # no copy: this writer alone changes them
        gone = np.fromiter(self._gone_since, dtype=np.uint64, count=len(self._gone_since))
        disk = read_json(self.meta_path)
        if disk is None:
            self._write_base(None, -1)
        elif (int(disk.get("layout", 0)), str(disk.get("base_id", ""))) != (self.layout, self.base_id):
            # A compaction swapped the files since this copy opened them: fold over what the
            # listing names now (the changes are the same; the levels and seqs are not). Only
            # the listing is taken over; the files are opened once, by ``_reopen`` below.
            self._adopt_listing(disk)
        if disk is not None:  # never a seq the listing has given out (a compaction takes the next)
            self._next_seq = max(self._next_seq, int(disk.get("next_seq", 1)))
        segments = [*self.segments]
        if len(keys) or len(gone):
            seg = _Segment(self._next_seq, len(keys), len(gone), generation, graph=False)
            self._next_seq += 1
            self._write_segment(seg, keys, vectors, gone)
            del vectors
            segments.append(seg)
        self._write_meta(generation, self.base_count, segments)
        self._empty_log()
        self._reopen()
        self.generation = generation
        if backstop and sum(not s.graph for s in self.segments) > MAX_FLAT_SEGMENTS:
            # The backstop: the caller holds the store lock, so the swap needs no other.
            compact(self.path, self.model, self.dim)
            self._reopen()
            self.generation = generation

    def _adopt_listing(self, meta: dict) -> None:
        """What ``fold`` writes into the next listing, from ``meta``: base, segments, seq."""
        self.base_file = self.path.with_name(str(meta.get("base", self.path.name)))
        self.base_id, self.layout = str(meta.get("base_id", "")), int(meta.get("layout", 0))
        self.base_count = int(meta.get("count", 0))
        self.base_graph = bool(meta.get("base_graph", True))
        self.segments = [_Segment(int(s["seq"]), int(s["count"]), int(s["gone"]), int(s["generation"]),
                                  graph=bool(s.get("graph", True))) for s in meta.get("segments", [])]
        self._next_seq = int(meta.get("next_seq", 1))

    def compaction_plan(self) -> dict | None:
        """What compaction is due over the listed segments, or None.

        ``{"kind": "merge", "seqs": [...]}``: FANOUT consecutive segments of one size tier
        (the newest such run), merged into one HNSW segment, never past a quarter of the base;
        ``{"kind": "rewrite", "seqs": [...]}``: every segment and the base as one new base, once
        the segments hold as many vectors as the base, or when the merge due would leave a
        search more than ``MAX_GRAPH_SEGMENTS`` graphs to walk beside the base;
        ``{"kind": "graph", "seqs": [...]}``: the same for a flat base (a rebuild's), whose graph
        was left to this.
        """
        segs = self.segments
        if self.base is not None and not self.base_graph:
            return {"kind": "graph", "seqs": [s.seq for s in segs]}
        if not segs:
            return None
        live_base = self.base_count - self._base_shadowed
        rewrite = {"kind": "rewrite", "seqs": [s.seq for s in segs]}
        if sum(s.count for s in segs) >= live_base:
            return rewrite
        run = _mergeable(segs, fold_threshold(self.base_count), live_base // 4)
        if run is None:
            return None
        if sum(s.graph for i, s in enumerate(segs) if not run <= i < run + FANOUT) + 1 > MAX_GRAPH_SEGMENTS:
            return rewrite  # one more graph for every search to walk: the base takes them all
        return {"kind": "merge", "seqs": [s.seq for s in segs[run : run + FANOUT]]}

    def layout_changed(self) -> bool:
        """Whether a compaction (or a rebuild) swapped the files since this copy opened them.

        A stat of the listing; the listing is read only when the stat differs.
        """
        stat = _stat_key(self.meta_path)
        if stat == self._listing_stat:
            return False
        disk = read_json(self.meta_path)
        if disk is None:
            return True
        changed = (int(disk.get("layout", 0)), str(disk.get("base_id", ""))) != (self.layout, self.base_id)
        if not changed:
            self._listing_stat = stat  # a fold's new listing: the generation tells the rest
        return changed

    def compact(self, *, hook: Callable[[str], None] | None = None) -> dict:
        """``compact`` over this index's files, then this copy reopened from them (its log
        replayed); call it with nothing unsaved."""
        if self._pending_count:
            raise RuntimeError("save the changes before compacting")
        result = compact(self.path, self.model, self.dim, hook=hook)
        fresh = VectorIndex.load(self.path, self.model, self.dim)
        self.__dict__.update(fresh.__dict__)
        return result

    def _view_segment(self, seg: _Segment) -> None:
        """Map a segment's files; raise ``IndexUnavailable`` if they are not what its listing says."""
        if not seg.count:
            return
        if seg.graph:
            seg.index = _new_index(self.dim)
            seg.index.view(str(self._segment_path(seg.seq, ".usearch")))
            if len(seg.index) != seg.count:
                raise IndexUnavailable(f"vector segment {seg.seq} does not match its metadata")
            seg.keys = np.asarray(seg.index.keys, dtype=np.uint64)
            return
        path = self._segment_path(seg.seq, ".flat")
        if path.stat().st_size != seg.count * (8 + 4 * self.dim):
            raise IndexUnavailable(f"vector segment {seg.seq} does not match its metadata")
        seg.keys = np.fromfile(path, dtype="<u8", count=seg.count)
        seg.vectors = np.memmap(path, dtype="<f4", mode="r", offset=8 * seg.count,
                                shape=(seg.count, self.dim))

    def _reopen(self) -> None:
        """The files just written, opened as a new process would (the log is empty).

        Opened into a fresh object and taken over in one step: the host searches while a
        write folds, and a search must see the old files and changes or the new ones, never
        a half-opened mix (one ``dict.update`` runs without releasing the GIL).
        """
        fresh = VectorIndex(self.path, self.model, self.dim)
        stat = _stat_key(self.meta_path)
        fresh._open_files(read_json(self.meta_path) or {})
        fresh._listing_stat = stat
        self.__dict__.update(fresh.__dict__)
        self._remove_unlisted()

    def _remove_unlisted(self) -> None:
        """Segment files no listing names: merged away, or left by a crash before their listing."""
        listed = {self._segment_path(s.seq, x).name for s in self.segments
                  for x in (".usearch" if s.graph else ".flat", ".gone")} | {self.base_file.name}
        for p in self.path.parent.glob(f"{self.path.stem}.seg*"):
            if p.name not in listed:
                p.unlink(missing_ok=True)
        if self.base_file != self.path:  # a compaction rewrote the base under a new name
            self.path.unlink(missing_ok=True)

    def build(self, keys: np.ndarray, vectors: np.ndarray, generation: int) -> None:
        """A fresh base holding exactly ``keys`` (a rebuild from the catalogue), the log emptied."""
        self._reset()
        self._pending, self._pending_count = [], 0
        full = _new_index(self.dim)
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        if len(keys):
            # Not copied: the graph points into ``vectors``, which outlives it (saved, then
            # dropped below), so a rebuild holds the vectors once, not twice.
            full.add(np.asarray(keys, dtype=np.uint64), vectors, copy=False)
        with self._saving():
            self._write_base(full, generation)
            count = len(full)
            del full
            old = read_json(self.meta_path) or {}
            self.base_file, self.base_id, self.base_graph = self.path, uuid.uuid4().hex, True
            self.layout = int(old.get("layout", 0)) + 1  # a compaction under way discards its work
            self._write_meta(generation, count, [])
            self._empty_log()
        self._reopen()
        self.generation = generation

    def build_flat(self, parts: Iterable[tuple[np.ndarray, np.ndarray]], generation: int) -> None:
        """A fresh index holding exactly the keys and vectors ``parts`` yields (a rebuild from
        the catalogue, streamed a part at a time), listed as a flat base, the log emptied.

        No graph is built: the base is searched exactly until compaction builds it (the plan
        ``graph``; the host's thread, a detached ``kb compact --auto``), as writes leave their
        merges to it. The file is written as the parts come (vectors, then the keys), so the
        rebuild holds one part and the keys, not every vector. A failure leaves the listed
        index as it was.
        """
        self._reset()
        self._pending, self._pending_count = [], 0
        old = read_json(self.meta_path) or {}
        seq = max(self._next_seq, int(old.get("next_seq", 1)))
        target = self._segment_path(seq, ".flatbase")
        tmp = tmp_path_for(target)
        keys: list[np.ndarray] = []
        with self._saving():
            self.path.parent.mkdir(parents=True, exist_ok=True)
            try:
                with open(tmp, "wb") as fh:
                    for part_keys, part_vectors in parts:
                        vecs = np.ascontiguousarray(part_vectors, dtype="<f4")
                        if vecs.shape != (len(part_keys), self.dim):
                            raise ModelMismatch(f"vectors of shape {vecs.shape} for a {self.dim}-d index")
                        fh.write(memoryview(vecs).cast("B"))
                        keys.append(np.asarray(part_keys, dtype="<u8"))
                    all_keys = np.concatenate(keys) if keys else np.zeros(0, dtype="<u8")
                    fh.write(memoryview(all_keys).cast("B"))
                if len(all_keys):
                    replace_into(tmp, target)
            finally:
                tmp.unlink(missing_ok=True)
        if not len(all_keys):
            self.build(all_keys.astype(np.uint64), np.zeros((0, self.dim), np.float32), generation)
            return
        with self._saving():
            self._next_seq = seq + 1
            self.base_file, self.base_id, self.base_graph = target, uuid.uuid4().hex, False
            self.layout = int(old.get("layout", 0)) + 1  # a compaction under way discards its work
            self._write_meta(generation, len(all_keys), [])
            self._empty_log()
        self._reopen()
        self.generation = generation

    def _write_segment(self, seg: _Segment, keys: np.ndarray, vectors, gone: np.ndarray) -> None:
        """A segment's files, each written whole under a name no listing holds yet."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if seg.count and seg.graph:
            index = _new_index(self.dim)
            index.add(keys, np.ascontiguousarray(vectors, dtype=np.float32), copy=False)
            target = self._segment_path(seg.seq, ".usearch")
            tmp = tmp_path_for(target)
            index.save(str(tmp))
            replace_into(tmp, target)
            del index
        elif seg.count:
            target = self._segment_path(seg.seq, ".flat")
            tmp = tmp_path_for(target)
            with open(tmp, "wb") as fh:
                # memoryview: written from the arrays, not from a bytes copy of each.
                fh.write(memoryview(np.ascontiguousarray(keys, dtype="<u8")).cast("B"))
                fh.write(memoryview(np.ascontiguousarray(vectors, dtype="<f4")).cast("B"))
            replace_into(tmp, target)
        target = self._segment_path(seg.seq, ".gone")
        tmp = tmp_path_for(target)
        tmp.write_bytes(np.ascontiguousarray(gone, dtype="<u8").tobytes())
        replace_into(tmp, target)

    def _write_base(self, full, generation: int) -> None:
        """The base file, replaced whole (its listing follows, then an empty log).

        A crash between the renames leaves a base newer than its metadata says; the log's
        batches are idempotent (set or delete a key), so replaying them over it is harmless,
        and a count that disagrees makes the next open rebuild from the catalogue.
        """
        self.path.parent.mkdir(parents=True, exist_ok=True)
        full = full if full is not None else _new_index(self.dim)
        tmp = tmp_path_for(self.path)
        full.save(str(tmp))
        replace_into(tmp, self.path)

    def _write_meta(self, generation: int, count: int, segments: list[_Segment]) -> None:
        """The listing: what the files hold and at which generation; replacing it commits a fold."""
        write_json(self.meta_path, {
            "model": self.model, "dim": self.dim, "generation": generation,
            "count": count, "segments": [s.meta() for s in segments], "next_seq": self._next_seq,
            "base": self.base_file.name, "base_graph": self.base_graph, "base_id": self.base_id,
            "layout": self.layout,
            "saved": time.time(), "localkb": __version__,
        })

    def _empty_log(self) -> None:
        log_tmp = tmp_path_for(self.log_path)
        log_tmp.write_bytes(b"")
        replace_into(log_tmp, self.log_path)
        self._log_end = self._log_records = 0

    # -- search ----------------------------------------------------------------
    def search(self, query: np.ndarray, count: int, *, exact_below: int) -> VectorHits:
        """Top ``count`` by cosine; exact when small or when HNSW returns too few."""
        n = len(self)
        if n == 0 or count <= 0:
            return VectorHits(np.zeros(0, np.uint64), np.zeros(0, np.float32), True)
        count = min(count, n)
        exact = n < exact_below
        keys, sims, exact = self._search_level(self.base, 0, query, count,
                                               live=self.base_count - self._base_shadowed,
                                               size=self.base_count, shadowed=self._base_shadowed,
                                               exact=exact or not self.base_graph)
        parts_k, parts_s = [keys], [sims]
        for level, seg in enumerate(self.segments, 1):
            if seg.count and not seg.graph:
                k, s = self._search_flat(seg, level, query, count)
                parts_k.append(k)
                parts_s.append(s)
            elif seg.index is not None:
                k, s, _ = self._search_level(seg.index, level, query, count, live=seg.count,
                                             size=seg.count, shadowed=0,
                                             exact=exact or seg.count < exact_below,
                                             per_candidate=SEGMENT_EXPANSION_PER_CANDIDATE)
                parts_k.append(k)
                parts_s.append(s)
        if len(self.delta):
            # Searched exactly, by the same usearch kernel as the files: a vector scores the
            # same whether it sits in the log, a segment or the base file.
            dkeys, dsims = self.delta.search(query, min(count, len(self.delta)))
            parts_k.append(dkeys)
            parts_s.append(dsims)
        if len(parts_k) > 1:
            keys, sims = np.concatenate(parts_k), np.concatenate(parts_s)
            order = np.argsort(-sims, kind="stable")[:count]
            keys, sims = keys[order], sims[order]
        return VectorHits(keys, sims, exact)

    def _search_level(self, index, level: int, query: np.ndarray, count: int, *, live: int, size: int,
                      shadowed: int, exact: bool,
                      per_candidate: int = EXPANSION_PER_CANDIDATE) -> tuple[np.ndarray, np.ndarray, bool]:
        """Top ``count`` of one file (level 0 the base), its keys set aside elsewhere dropped."""
        if index is None or live <= 0:
            return np.zeros(0, np.uint64), np.zeros(0, np.float32), exact
        want = min(count, live)
        ask = min(size, want + min(shadowed, want))
        owner = self.owner
        while True:
            if not exact:
                # 8x the candidates asked for: on 33k SciFact passages (M=16) HNSW recall of
                # the exact top 40 is 0.980 at 2x, 0.998 at 8x, for ~0.6 ms more per query.
                index.expansion_search = max(64, per_candidate * ask)
                m = index.search(query, ask)
                if len(m.keys) < min(ask, size):
                    exact = True
            if exact:
                m = index.search(query, ask, exact=True)
            keys = np.asarray(m.keys, np.uint64)
            sims = 1.0 - np.asarray(m.distances, np.float32)
            if owner:
                keep = np.fromiter((owner.get(k, 0) == level for k in keys.tolist()), bool, len(keys))
                keys, sims = keys[keep], sims[keep]
            if len(keys) >= want or ask >= size:
                return keys[:want], sims[:want], exact
            ask = min(size, ask * 2)

    def _search_flat(self, seg: _Segment, level: int, query: np.ndarray,
                     count: int) -> tuple[np.ndarray, np.ndarray]:
        """Exact top ``count`` of a flat segment, its keys set aside elsewhere dropped."""
        ask = min(seg.count, 2 * count)
        while True:
            keys, distances = _exact_top(seg.vectors, seg.keys, query, ask)
            sims = 1.0 - distances
            keep = np.fromiter((self.owner.get(k) == level for k in keys.tolist()), bool, len(keys))
            if keep.sum() >= count or ask >= seg.count:
                return keys[keep][:count], sims[keep][:count]
            ask = min(seg.count, ask * 2)

    def log_size(self) -> dict:
        """What the log holds now, and the segments (doctor and the benches print it)."""
        return {"records": self._log_records, "bytes": self._log_end,
                "fold_at": fold_threshold(self.base_count), "segments": [s.count for s in self.segments]}


def remove_index(path: Path) -> None:
    """Delete a vector index's files: base, listing, log and segments (a model switched away, a repair)."""
    for p in (path, path.with_suffix(".json"), path.with_suffix(".log"),
              *path.parent.glob(f"{path.stem}.seg*")):
        p.unlink(missing_ok=True)


def remove_other_models(kb_dir: Path, model: str) -> None:
    """Delete every vector index in ``kb_dir`` that is not ``model``'s (a re-embed's old model)."""
    own = vector_file(kb_dir, model).stem
    for p in kb_dir.glob("vectors-*"):
        if p.stem != own and not p.name.startswith(f"{own}.seg"):
            p.unlink(missing_ok=True)


def _tier(count: int, threshold: int) -> int:
    tier = 0
    while count >= threshold * FANOUT ** (tier + 1):
        tier += 1
    return tier


def _mergeable(segments: list[_Segment], threshold: int, cap: int) -> int | None:
    """Where the newest run of FANOUT consecutive segments of one size tier starts, if merged
    they hold at most ``cap`` vectors (a quarter of the base: a merge's memory stays a fraction
    of it). Not only the newest FANOUT: writes fold while a compaction runs, so runs can sit
    below newer segments."""
    for start in range(len(segments) - FANOUT, -1, -1):
        run = segments[start : start + FANOUT]
        if sum(s.count for s in run) <= cap and len({_tier(s.count, threshold) for s in run}) == 1:
            return start
    return None


def _stat_key(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size



def compaction_lock_path(path: Path) -> Path:
    """The lock one compaction at a time holds (hidden: no sweep or listing cleanup touches it)."""
    return path.with_name(f".{path.stem}.compact.lock")


def compact(path: Path, model: str, dim: int, *,
            swap_lock: Callable[[], AbstractContextManager] = nullcontext,
            hook: Callable[[str], None] | None = None) -> dict:
    """Run every compaction step due over the index at ``path``, one at a time per index.

    Each step builds its output from the listed files alone (never a writer's in-memory
    state), outside ``swap_lock``, under temporary names; then, under ``swap_lock`` (the
    store lock), re-reads the listing and, if the base and every input are still listed,
    renames the output into place under a fresh seq and writes a listing that replaces the
    inputs and keeps every segment a write added meanwhile, its ``layout`` bumped (the
    generation unchanged: the content is the same); otherwise it discards the output. A
    crash at any point leaves the old listing valid. ``hook(point)`` is called at
    ``"built"`` and ``"renamed"`` (tests stop or kill there).
    """
    started = time.perf_counter()
    fd = try_lock(compaction_lock_path(path))
    if fd is None:
        return {"state": "already running", "steps": []}
    try:
        before = _listed_shape(path)
        steps: list[dict] = []
        while True:
            step = _compact_step(path, model, dim, swap_lock, hook)
            if step is None:
                break
            steps.append(step)
            if step["state"] != "swapped":
                break
        state = ("compacted" if steps and steps[-1]["state"] == "swapped" else
                 steps[-1]["state"] if steps else "nothing due")
        return {"state": state, "steps": steps, "segments_before": before,
                "segments_after": _listed_shape(path), "seconds": time.perf_counter() - started}
    finally:
        unlock(fd)


def _listed_shape(path: Path) -> dict:
    meta = read_json(path.with_suffix(".json")) or {}
    segs = meta.get("segments", [])
    return {"base": meta.get("count", 0), "graph": sum(bool(s.get("graph")) for s in segs),
            "flat": sum(not s.get("graph") for s in segs), "layout": meta.get("layout", 0)}


def _live_masks(parts: list[_Segment], gones: list[np.ndarray]) -> tuple[list[np.ndarray], np.ndarray]:
    """Which keys of each run segment (oldest first) hold live vectors, by the run alone: a
    key's newest copy in the run, unless a newer run segment's ``.gone`` deleted it. Also every
    key the run mentions (copies and deletes: what it shadows in older levels)."""
    masks: list[np.ndarray] = []
    seen = np.zeros(0, dtype=np.uint64)
    for seg, gone in zip(reversed(parts), reversed(gones), strict=True):
        masks.append(~np.isin(seg.keys, seen) if len(seen) else np.ones(len(seg.keys), bool))
        seen = np.union1d(seen, np.concatenate([seg.keys, gone]).astype(np.uint64))
    return masks[::-1], seen


def _compact_step(path: Path, model: str, dim: int, swap_lock, hook) -> dict | None:
    meta_path = path.with_suffix(".json")
    meta = read_json(meta_path)
    if meta is None:
        return None
    snap = VectorIndex(path, model, dim)  # the listed files only: no log, no writer's changes
    snap._open_files(meta)
    plan = snap.compaction_plan()
    if plan is None:
        return None
    started = time.perf_counter()
    parts = [s for s in snap.segments if s.seq in set(plan["seqs"])]
    gones = [np.fromfile(snap._segment_path(s.seq, ".gone"), dtype="<u8").astype(np.uint64) for s in parts]
    masks, seen = _live_masks(parts, gones)
    tmp_main = tmp_path_for(path.with_name(f"{path.stem}.compact.usearch"))
    tmp_gone = tmp_path_for(path.with_name(f"{path.stem}.compact.gone"))
    if plan["kind"] == "merge":  # at most a quarter of the base: its vectors held at once
        gone = np.unique(np.concatenate(gones)) if gones else np.zeros(0, np.uint64)
        keys = np.concatenate([s.keys[m] for s, m in zip(parts, masks, strict=True)])
        vecs = np.concatenate([s.get(m, dim) for s, m in zip(parts, masks, strict=True)])
        if len(keys):
            index = _new_index(dim)
            index.add(keys, np.ascontiguousarray(vecs, dtype=np.float32), copy=False)
            index.save(str(tmp_main))
            del index
        del vecs
        tmp_gone.write_bytes(np.ascontiguousarray(gone, dtype="<u8").tobytes())
        count, gone_count = len(keys), len(gone)
    else:
        full = _new_index(dim)
        if snap.base is not None and not snap.base_graph:  # a rebuild's flat base: its graph, here
            flat = snap.base
            for start in range(0, len(flat), GRAPH_PART):
                keys = np.asarray(flat.keys[start : start + GRAPH_PART], dtype=np.uint64)
                live = ~np.isin(keys, seen) if len(seen) else np.ones(len(keys), bool)
                if live.any():
                    full.add(keys[live], np.ascontiguousarray(flat.vectors[start : start + GRAPH_PART][live],
                                                              dtype=np.float32))
        elif snap.base is not None:
            full.load(str(snap.base_file))
            in_base = seen[np.atleast_1d(np.asarray(full.contains(seen), dtype=bool))] if len(seen) else seen
            if len(in_base):
                full.remove(in_base)
        for seg, mask in zip(parts, masks, strict=True):  # a segment at a time: memory stays the base's
            if mask.any():
                full.add(seg.keys[mask], np.ascontiguousarray(seg.get(mask, dim), dtype=np.float32))
        full.save(str(tmp_main))
        count, gone_count = len(full), 0
        del full
    del snap
    for tmp in (tmp_main, tmp_gone):
        if tmp.exists():
            with open(tmp, "rb") as fh:
                os.fsync(fh.fileno())
    built = time.perf_counter() - started
    step = {"kind": plan["kind"], "inputs": len(parts), "vectors": count, "build_seconds": built}
    if hook:
        hook("built")
    with swap_lock():
        now = read_json(meta_path)
        listed = {int(s["seq"]) for s in (now or {}).get("segments", [])}
        if (now is None or now.get("base_id", "") != meta.get("base_id", "")
                or now.get("base", path.name) != meta.get("base", path.name)
                or not set(plan["seqs"]) <= listed):
            # A rebuild (or a model switch) replaced the files meanwhile: this work is moot.
            tmp_main.unlink(missing_ok=True)
            tmp_gone.unlink(missing_ok=True)
            return {**step, "state": "discarded"}
        seq = int(now.get("next_seq", 1))
        old_base = now.get("base", path.name)
        segs = now["segments"]
        kept = [s for s in segs if int(s["seq"]) not in set(plan["seqs"])]
        new = dict(now, next_seq=seq + 1, layout=int(now.get("layout", 0)) + 1, saved=time.time())
        if plan["kind"] == "merge":
            first = next(i for i, s in enumerate(segs) if int(s["seq"]) in set(plan["seqs"]))
            if tmp_main.exists():
                os.replace(tmp_main, path.with_name(f"{path.stem}.seg{seq}.usearch"))
            os.replace(tmp_gone, path.with_name(f"{path.stem}.seg{seq}.gone"))
            merged = {"seq": seq, "count": count, "gone": gone_count,
                      "generation": max(int(s.generation) for s in parts), "graph": True}
            new["segments"] = [*kept[:first], merged, *kept[first:]]
        else:
            base_name = f"{path.stem}.seg{seq}.base"
            os.replace(tmp_main, path.with_name(base_name))
            new.update(segments=kept, base=base_name, base_graph=True, base_id=uuid.uuid4().hex, count=count)
        if hook:
            hook("renamed")
        write_json(meta_path, new)  # the commit
        for s in segs:  # the inputs, and a rewritten base: no listing names them now
            if int(s["seq"]) in set(plan["seqs"]):
                for suffix in (".usearch" if s.get("graph", True) else ".flat", ".gone"):
                    path.with_name(f"{path.stem}.seg{s['seq']}{suffix}").unlink(missing_ok=True)
        if plan["kind"] != "merge":  # a rewrite (or a flat base's graph) named a new base
            path.with_name(old_base).unlink(missing_ok=True)
    return {**step, "state": "swapped", "seconds": time.perf_counter() - started}


class Changed:
    """The vectors changed since the base file: a flat array and a key -> row map, searched exactly.

    No HNSW graph: it would only ever be searched exactly, and building one cost an insertion
    per changed vector on every write and again on every open that replays the log (up to
    ``fold_threshold`` of them: 9,375 at 300,000 passages). A removed row is filled with the
    last one, so rows ``[0, len)`` are always the live vectors. A lock makes a search see each
    change whole (the host searches while a write applies its changes; usearch's own index
    was safe for that).
    """

    def __init__(self, dim: int) -> None:
        self.dim = dim
        self._lock = threading.Lock()
        self.vectors = np.zeros((0, dim), dtype=np.float32)
        self.keys = np.zeros(0, dtype=np.uint64)
        self.row: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self.row)

    def contains(self, keys: np.ndarray) -> np.ndarray:
        return np.fromiter((k in self.row for k in np.atleast_1d(keys).tolist()), bool, np.size(keys))

    def put(self, keys: np.ndarray, vectors: np.ndarray) -> None:
        """Set each key's vector (a key given twice keeps its last)."""
        vectors = np.ascontiguousarray(vectors, dtype=np.float32).reshape(-1, self.dim)
        keys = np.atleast_1d(np.asarray(keys, dtype=np.uint64))
        with self._lock:
            self._put(keys, vectors)

    def _put(self, keys: np.ndarray, vectors: np.ndarray) -> None:
        n = len(self.row)
        if n + len(keys) > len(self.vectors):  # grow by half: appends cost O(1) each
            cap = max(64, len(self.vectors) * 3 // 2, n + len(keys))
            grown = np.zeros((cap, self.dim), dtype=np.float32)
            grown[:n] = self.vectors[:n]
            grown_keys = np.zeros(cap, dtype=np.uint64)
            grown_keys[:n] = self.keys[:n]
            self.vectors, self.keys = grown, grown_keys
        for key, vec in zip(keys.tolist(), vectors, strict=True):
            at = self.row.get(key)
            if at is None:
                at = self.row[key] = len(self.row)
                self.keys[at] = key
            self.vectors[at] = vec

    def remove(self, keys: np.ndarray) -> None:
        with self._lock:
            self._remove(keys)

    def _remove(self, keys: np.ndarray) -> None:
        for key in np.atleast_1d(keys).tolist():
            at = self.row.pop(key, None)
            if at is None:
                continue
            last = len(self.row)
            if at != last:  # the last row moves into the hole
                moved = int(self.keys[last])
                self.vectors[at] = self.vectors[last]
                self.keys[at] = moved
                self.row[moved] = at

    def view(self) -> tuple[np.ndarray, np.ndarray]:
        """The live keys and vectors without a copy: only for the writer, which alone changes
        them (searches read under the lock); a fold writes a segment from these."""
        n = len(self.row)
        return self.keys[:n], self.vectors[:n]

    def search(self, query: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
        """Exact top ``count`` by cosine (``_exact_top``)."""
        with self._lock:
            n = len(self.row)
            keys, distances = _exact_top(self.vectors[:n], self.keys, query, min(count, n))
            return keys, 1.0 - distances


def _record_dtype(dim: int) -> np.dtype:
    return np.dtype([("op", "u1"), ("key", "<u8"), ("vec", "<f4", (dim,))])
