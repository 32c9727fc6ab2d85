"""One usearch index per knowledge base, for that knowledge base's model: a base file plus an append log.

The base file (``vectors-<model>.usearch``) is an HNSW index saved at some catalogue
generation and opened memory-mapped (``Index.view``): opening it costs no read of the
vectors, and only the pages a search touches become resident. Every later write appends
one batch of upserts and deletes to ``vectors-<model>.log`` and costs what it writes,
not what the knowledge base holds (a full save of 300,000 vectors rewrote ~500 MB for
one small note). Readers apply the log over the base: the changed vectors are searched
exactly beside the base, and the base's superseded or deleted keys are set aside. When
the log outgrows ``fold_threshold`` it is folded into a new base file (the one write
whose cost grows with the knowledge base, paid once per that many changes).

Metadata beside the files (``.json``) records the model, dimension, the base file's
generation and count. A log batch carries its generation and a CRC; a torn tail (a crash
mid-append) is ignored on read and cut off by the next append.
"""

from __future__ import annotations

import os
import struct
import threading
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from localkb import __version__
from localkb.atomic import read_json, replace_into, tmp_path_for, write_json
from localkb.errors import IndexUnavailable, ModelMismatch

#: HNSW search expansion per candidate requested (see VectorIndex.search).
EXPANSION_PER_CANDIDATE = 8
_BATCH = struct.Struct("<4sQI")  # magic, generation, records
_MAGIC = b"LKV1"
_UPSERT, _DELETE = 1, 2


def fold_threshold(base_count: int) -> int:
    """Changed vectors the log may hold before it is folded into the base file.

    1/32 of the base (at least 1,024): the exact search over the log's vectors stays
    under ~2 ms at 300,000 passages, and the fold's full rewrite is paid once per
    ~9,400 changed passages there (~900 notes of ten passages).
    """
    return max(1024, base_count // 32)


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


class VectorIndex:
    """A usearch HNSW base file (memory-mapped) plus an append log of the changes since."""

    def __init__(self, path: Path, model: str, dim: int) -> None:
        self.path = path
        self.meta_path = path.with_suffix(".json")
        self.log_path = path.with_suffix(".log")
        self.model = model
        self.dim = dim
        self.generation = 0
        self.base = None  # usearch Index (a view of the base file), or None when it holds nothing
        self.base_count = 0
        self.base_generation = 0
        self.delta = Changed(dim)  # vectors changed since the base (in memory, searched exactly)
        self.dead: set[int] = set()  # base keys deleted or superseded by ``delta``
        self._pending: list[tuple[int, int, np.ndarray | None]] = []  # not yet in the log
        self._pending_count = 0  # changes since the last save (``_pending`` is emptied once a fold is due)
        self._log_end = 0  # bytes of whole batches in the log
        self._log_records = 0

    # -- opening ---------------------------------------------------------------
    @classmethod
    def load(cls, path: Path, model: str, dim: int) -> VectorIndex:
        """Open the saved index; raise ``IndexUnavailable`` if absent, corrupt or not ours."""
        meta = read_json(path.with_suffix(".json"))
        if meta is None or not path.exists():
            raise IndexUnavailable(f"no vector index at {path.name}")
        if meta.get("model") != model or meta.get("dim") != dim:
            raise ModelMismatch(
                f"vector index {path.name} holds {meta.get('model')} ({meta.get('dim')}-d), "
                f"the knowledge base uses {model} ({dim}-d)")
        vi = cls(path, model, dim)
        try:
            base = _new_index(dim)
            base.view(str(path))
        except Exception as err:
            raise IndexUnavailable(f"vector index {path.name} could not be read: {err}") from err
        if base.ndim != dim or len(base) != meta.get("count"):
            raise IndexUnavailable(f"vector index {path.name} does not match its metadata")
        vi.base = base if len(base) else None
        vi.base_count = len(base)
        vi.base_generation = vi.generation = int(meta.get("generation", -1))
        vi._read_log()
        return vi

    def _read_log(self) -> None:
        """Apply the log's whole batches newer than the base; stop at a torn tail."""
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
    def _in_base(self, keys: np.ndarray) -> np.ndarray:
        """Which of ``keys`` the base holds and no later change set aside."""
        if self.base is None or not len(keys):
            return np.zeros(len(keys), dtype=bool)
        held = np.atleast_1d(np.asarray(self.base.contains(keys), dtype=bool))
        return held & np.fromiter((k not in self.dead for k in keys.tolist()), bool, len(keys))

    def _set(self, keys: np.ndarray, vectors: np.ndarray) -> None:
        self.dead.update(keys[self._in_base(keys)].tolist())
        self.delta.put(keys, vectors)

    def _drop(self, keys: np.ndarray) -> None:
        if not len(keys):
            return
        in_delta = self.delta.contains(keys)
        self.delta.remove(keys[in_delta])
        rest = keys[~in_delta]
        self.dead.update(rest[self._in_base(rest)].tolist())

    def __len__(self) -> int:
        return self.base_count - len(self.dead) + len(self.delta)

    def contains(self, key: int) -> bool:
        k = np.array([key], dtype=np.uint64)
        return bool(self.delta.contains(k)[0]) or bool(self._in_base(k)[0])

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

        A fold writes ``delta`` and ``dead``, never the pending records, so from then on
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
        try:
            if self._fold_due():
                self.fold(generation)
                return
            if not self.path.exists():  # a new index: an empty base (older than any batch) first
                self._write_base(None, -1)
            self._append(generation)
        except (OSError, RuntimeError) as err:
            raise IndexUnavailable(f"vector index {self.path.name} could not be saved: {err}") from err
        self.generation = generation

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

    def fold(self, generation: int) -> None:
        """Write base + log as a new base file at ``generation`` and start an empty log."""
        full = _new_index(self.dim)
        if self.base is not None:
            full.load(str(self.path))
            dead = np.fromiter(self.dead, dtype=np.uint64, count=len(self.dead))
            if len(dead):
                full.remove(dead)
        if len(self.delta):
            keys, vectors = self.delta.items()
            full.add(keys, vectors)
        self._write_base(full, generation)
        self.base = None
        self.base_count = len(full)
        del full
        if self.base_count:
            self.base = _new_index(self.dim)
            self.base.view(str(self.path))
        self.delta, self.dead, self._pending, self._pending_count = Changed(self.dim), set(), [], 0
        self.generation = generation

    def build(self, keys: np.ndarray, vectors: np.ndarray, generation: int) -> None:
        """A fresh base holding exactly ``keys`` (a rebuild from the catalogue), the log emptied."""
        self.delta, self.dead, self._pending, self._pending_count = Changed(self.dim), set(), [], 0
        self.base = None
        full = _new_index(self.dim)
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        if len(keys):
            # Not copied: the graph points into ``vectors``, which outlives it (saved, then
            # dropped below), so a rebuild holds the vectors once, not twice.
            full.add(np.asarray(keys, dtype=np.uint64), vectors, copy=False)
        try:
            self._write_base(full, generation)
        except (OSError, RuntimeError) as err:
            raise IndexUnavailable(f"vector index {self.path.name} could not be saved: {err}") from err
        self.base_count = len(full)
        del full
        if self.base_count:
            self.base = _new_index(self.dim)
            self.base.view(str(self.path))
        self.generation = generation

    def _write_base(self, full, generation: int) -> None:
        """Base file, then its metadata, then an empty log: each replaced whole, never half-written.

        A crash between the renames leaves a base newer than its metadata says; the log's
        batches are idempotent (set or delete a key), so replaying them over it is harmless,
        and a count that disagrees makes the next open rebuild from the catalogue.
        """
        self.path.parent.mkdir(parents=True, exist_ok=True)
        full = full if full is not None else _new_index(self.dim)
        tmp = tmp_path_for(self.path)
        full.save(str(tmp))
        replace_into(tmp, self.path)
        write_json(self.meta_path, {
            "model": self.model, "dim": self.dim, "generation": generation,
            "count": len(full), "saved": time.time(), "localkb": __version__,
        })
        log_tmp = tmp_path_for(self.log_path)
        log_tmp.write_bytes(b"")
        replace_into(log_tmp, self.log_path)
        self.base_generation = generation
        self._log_end = self._log_records = 0

    # -- search ----------------------------------------------------------------
    def search(self, query: np.ndarray, count: int, *, exact_below: int) -> VectorHits:
        """Top ``count`` by cosine; exact when small or when HNSW returns too few."""
        n = len(self)
        if n == 0 or count <= 0:
            return VectorHits(np.zeros(0, np.uint64), np.zeros(0, np.float32), True)
        count = min(count, n)
        exact = n < exact_below
        keys, sims, exact = self._search_base(query, count, exact)
        if len(self.delta):
            # Searched exactly, by the same usearch kernel as the base: a vector scores the
            # same whether it sits in the log or (after a fold) in the base file.
            dkeys, dsims = self.delta.search(query, min(count, len(self.delta)))
            keys = np.concatenate([keys, dkeys])
            sims = np.concatenate([sims, dsims])
            order = np.argsort(-sims, kind="stable")[:count]
            keys, sims = keys[order], sims[order]
        return VectorHits(keys, sims, exact)

    def _search_base(self, query: np.ndarray, count: int, exact: bool) -> tuple[np.ndarray, np.ndarray, bool]:
        live = self.base_count - len(self.dead)
        if self.base is None or live <= 0:
            return np.zeros(0, np.uint64), np.zeros(0, np.float32), exact
        want = min(count, live)
        ask = min(self.base_count, want + min(len(self.dead), want))
        while True:
            if not exact:
                # 8x the candidates asked for: on 33k SciFact passages (M=16) HNSW recall of
                # the exact top 40 is 0.980 at 2x, 0.998 at 8x, for ~0.6 ms more per query.
                self.base.expansion_search = max(64, EXPANSION_PER_CANDIDATE * ask)
                m = self.base.search(query, ask)
                if len(m.keys) < min(ask, self.base_count):
                    exact = True
            if exact:
                m = self.base.search(query, ask, exact=True)
            keys = np.asarray(m.keys, np.uint64)
            sims = 1.0 - np.asarray(m.distances, np.float32)
            if self.dead:
                keep = np.fromiter((int(k) not in self.dead for k in keys.tolist()), bool, len(keys))
                keys, sims = keys[keep], sims[keep]
            if len(keys) >= want or ask >= self.base_count:
                return keys[:want], sims[:want], exact
            ask = min(self.base_count, ask * 2)

    def log_size(self) -> dict:
        """What the log holds now: batches' records and bytes (doctor and the benches print it)."""
        return {"records": self._log_records, "bytes": self._log_end,
                "fold_at": fold_threshold(self.base_count)}


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

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        with self._lock:
            n = len(self.row)
            return self.keys[:n].copy(), self.vectors[:n].copy()

    def search(self, query: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
        """Exact top ``count`` by cosine, by the kernel usearch's exact index search uses."""
        _index_class()  # onnxruntime before usearch's extension (see there)
        from usearch.index import MetricKind
        from usearch.index import search as exact_search

        with self._lock:
            n = len(self.row)
            found = exact_search(self.vectors[:n], np.asarray(query, dtype=np.float32), min(count, n),
                                 MetricKind.Cos, exact=True, threads=1)
            rows = np.asarray(found.keys, dtype=np.int64)
            return self.keys[rows], 1.0 - np.asarray(found.distances, np.float32)


def _record_dtype(dim: int) -> np.dtype:
    return np.dtype([("op", "u1"), ("key", "<u8"), ("vec", "<f4", (dim,))])
