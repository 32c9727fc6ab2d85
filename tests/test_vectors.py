"""The vector index: a memory-mapped base file plus an append log, folded in on a schedule."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from localkb.store import vectors as vmod
from localkb.store.vectors import VectorIndex

DIM = 16


def unit(n: int, seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


@pytest.fixture
def base(tmp_path: Path) -> VectorIndex:
    vi = VectorIndex(tmp_path / "v.usearch", "m", DIM)
    vi.build(np.arange(2000, dtype=np.uint64), unit(2000, 1), generation=1)
    return VectorIndex.load(tmp_path / "v.usearch", "m", DIM)


def test_a_small_write_appends_to_the_log_and_leaves_the_base_file_alone(base: VectorIndex) -> None:
    before = base.path.stat()
    base.upsert(np.arange(5000, 5010, dtype=np.uint64), unit(10, 2))
    base.remove(np.array([3], dtype=np.uint64))
    base.save(2)
    after = base.path.stat()
    assert (after.st_ino, after.st_mtime_ns, after.st_size) == (before.st_ino, before.st_mtime_ns,
                                                                before.st_size)
    # The log holds the 11 changes, not the 2,000 vectors (a record is 9 bytes + 4 per dimension).
    assert base.log_path.stat().st_size < 11 * (9 + 4 * DIM) + 64
    again = VectorIndex.load(base.path, "m", DIM)
    assert (len(again), again.generation) == (2009, 2)
    assert again.contains(5009) and not again.contains(3) and again.contains(4)


def test_search_over_base_and_log_equals_a_fresh_index_of_the_same_vectors(base: VectorIndex,
                                                                          tmp_path: Path) -> None:
    vecs = dict(zip(range(2000), unit(2000, 1), strict=True))
    moved = unit(50, 3)
    base.upsert(np.arange(100, 150, dtype=np.uint64), moved)  # superseded in the base
    vecs.update(zip(range(100, 150), moved, strict=True))
    base.remove(np.arange(0, 40, dtype=np.uint64))
    for k in range(40):
        del vecs[k]
    base.save(2)
    fresh = VectorIndex(tmp_path / "f.usearch", "m", DIM)
    keys = np.array(sorted(vecs), dtype=np.uint64)
    fresh.build(keys, np.stack([vecs[int(k)] for k in keys]), 2)
    logged = VectorIndex.load(base.path, "m", DIM)
    for q in unit(20, 4):
        a = logged.search(q, 10, exact_below=10**6)
        b = fresh.search(q, 10, exact_below=10**6)
        assert a.keys.tolist() == b.keys.tolist()
        assert np.allclose(a.similarities, b.similarities, atol=1e-6)


def test_the_log_is_folded_into_a_segment_when_it_outgrows_its_threshold(base: VectorIndex) -> None:
    limit = vmod.fold_threshold(base.base_count)
    before = base.path.stat()
    gen = 1
    for start in range(0, limit, 256):
        gen += 1
        base.upsert(np.arange(10_000 + start, 10_256 + start, dtype=np.uint64), unit(256, gen))
        base.save(gen)
    assert base.log_size()["records"] == limit  # exactly at the threshold: not folded yet
    gen += 1
    base.upsert(np.array([99_999], dtype=np.uint64), unit(1, 99))
    base.remove(np.array([5], dtype=np.uint64))
    base.save(gen)
    assert base.log_size()["records"] == 0 and base.log_path.stat().st_size == 0
    after = base.path.stat()  # the base file is not rewritten: the segment holds the changes
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    again = VectorIndex.load(base.path, "m", DIM)
    assert again.log_size()["segments"] == [limit + 1]
    assert (again.base_count, len(again)) == (2000, 2000 + limit + 1 - 1)
    assert again.generation == again.base_generation == gen
    assert not again.contains(5) and again.contains(6) and again.contains(99_999)
    hit = again.search(unit(1, 99)[0], 1, exact_below=0)
    assert hit.keys.tolist() == [99_999] and hit.similarities[0] > 0.999


def test_segments_merge_by_tier_and_fold_into_the_base_once_they_outgrow_it(tmp_path: Path) -> None:
    """Each fold writes one segment; a compaction after it merges FANOUT of one tier into one;
    when the segments hold as many vectors as the base, one new base. Searches equal a fresh
    index of the same vectors at every step, and a fresh process opens what the last write left."""
    vi = VectorIndex(tmp_path / "v.usearch", "m", DIM)
    n = 30_000  # a merge holds at most a quarter of the base: ~7,000 here, 4 x ~1,200 fit
    vecs = dict(zip(range(n), unit(n, 1), strict=True))
    vi.build(np.arange(n, dtype=np.uint64), unit(n, 1), generation=1)
    limit = vmod.fold_threshold(n)
    seen, gen, rng = [], 1, np.random.default_rng(5)
    while vi.base_count == n:
        gen += 1
        keys = rng.choice(60_000, size=300, replace=False).astype(np.uint64)
        moved = unit(300, gen)
        vi.upsert(keys, moved)
        vecs.update(zip(keys.tolist(), moved, strict=True))
        gone = rng.choice(60_000, size=20, replace=False).astype(np.uint64)
        vi.remove(gone)
        for k in gone.tolist():
            vecs.pop(k, None)
        vi.save(gen)
        vi.compact()  # compaction on its schedule: after every write
        seen.append(list(vi.log_size()["segments"]))
        if gen % 7 == 0 or vi.base_count != n:
            again = VectorIndex.load(vi.path, "m", DIM)
            assert len(again) == len(vecs)
            all_keys = np.array(list(vecs), dtype=np.uint64)
            all_vecs = np.stack(list(vecs.values()))
            found = []
            for q in unit(5, gen):
                best = all_keys[np.argsort(-(all_vecs @ q), kind="stable")[:10]]
                assert again.search(q, 10, exact_below=10**9).keys.tolist() == best.tolist()
                found.append(len(set(again.search(q, 10, exact_below=0).keys.tolist()) & set(best.tolist())))
            assert sum(found) >= 0.9 * 10 * len(found), found  # the graphs (base, merged segments)
            assert all(again.contains(k) for k in list(vecs)[-50:])
    assert seen[0] == [] and max(len(s) for s in seen) <= 2 * vmod.FANOUT
    assert any(len(s) == 1 and s[0] > 3 * limit for s in seen)  # a merged segment
    assert any(len(s) >= 2 for s in seen)  # a merged (graph) segment searched beside flat ones
    assert seen[-1] == [] and vi.base_count == len(vecs)
    files = sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("."))
    # Merged-away segments and the old base are removed: the new base is all that is listed.
    assert files == sorted(_listed_files(vi.path) | {"v.json", "v.log"}) and len(_listed_files(vi.path)) == 1


@pytest.mark.parametrize("compacting", [True, False])
def test_a_search_walks_a_bounded_number_of_graph_segments_whatever_was_written(tmp_path: Path,
                                                                               compacting: bool) -> None:
    """Merged (graph) segments each cost a search an HNSW walk of its own (100,000 passages: the
    vector leg's p50 5.9 -> 15.8 ms with four). Below ~300,000 a merge is capped at a quarter
    of the base, so merged segments could pile up to 2 x FANOUT before the base was rewritten;
    with MAX_GRAPH_SEGMENTS, the compaction that would make one more rewrites the base instead.
    With compaction never run, flat segments are bounded too: past MAX_FLAT_SEGMENTS the write
    compacts inline. Searches equal brute force along the way; a fresh process opens what the
    writes left."""
    n = 24_000  # folds of 1,500 (500 a write); a merged segment 6,000, a quarter of the base
    vi = VectorIndex(tmp_path / "v.usearch", "m", DIM)
    vi.build(np.arange(n, dtype=np.uint64), unit(n, 1), generation=1)
    vecs = dict(zip(range(n), unit(n, 1), strict=True))
    graphs, flats, gen, key = [], [], 1, 10**6
    while vi.base_count <= n:
        gen += 1
        moved = unit(500, gen)
        vi.upsert(np.arange(key, key + 500, dtype=np.uint64), moved)
        vecs.update(zip(range(key, key + 500), moved, strict=True))
        key += 500
        vi.save(gen)
        if compacting:
            vi.compact()
        graphs.append(sum(s.graph for s in vi.segments))
        flats.append(sum(not s.graph for s in vi.segments))
        if gen % 6 == 0 or vi.base_count > n:
            again = VectorIndex.load(vi.path, "m", DIM)
            assert len(again) == len(vecs)
            all_keys = np.array(list(vecs), dtype=np.uint64)
            all_vecs = np.stack(list(vecs.values()))
            for q in unit(3, gen):
                best = all_keys[np.argsort(-(all_vecs @ q), kind="stable")[:10]]
                assert again.search(q, 10, exact_below=10**9).keys.tolist() == best.tolist()
    if compacting:
        assert max(graphs) == vmod.MAX_GRAPH_SEGMENTS and max(flats) < vmod.FANOUT, (graphs, flats)
    else:
        assert max(graphs) <= vmod.MAX_GRAPH_SEGMENTS and max(flats) == vmod.MAX_FLAT_SEGMENTS, (
            graphs, flats)


def test_a_torn_log_tail_is_ignored_and_cut_off_by_the_next_write(base: VectorIndex) -> None:
    base.upsert(np.array([7000], dtype=np.uint64), unit(1, 5))
    base.save(2)
    whole = base.log_path.stat().st_size
    with open(base.log_path, "ab") as fh:  # a crash in the middle of the next append
        fh.write(b"LKV1" + b"\x03" * 30)
    torn = VectorIndex.load(base.path, "m", DIM)
    assert (len(torn), torn.generation) == (2001, 2)
    torn.upsert(np.array([7001], dtype=np.uint64), unit(1, 6))
    torn.save(3)
    again = VectorIndex.load(base.path, "m", DIM)
    assert (len(again), again.generation) == (2002, 3)
    assert again.log_path.stat().st_size == 2 * whole


def test_a_write_past_the_fold_line_holds_its_vectors_once(tmp_path: Path) -> None:
    """A big switch catches up in slices (store/kb.py ``_apply``): past the fold line the write
    is folded into the base, so its vectors must not also wait, all of them, as log records."""
    import tracemalloc

    dim, n, step = 128, 12_000, 2048
    vi = VectorIndex(tmp_path / "big.usearch", "m", dim)
    rng = np.random.default_rng(7)
    first = None
    tracemalloc.start()
    try:
        for start in range(0, n, step):
            vecs = rng.standard_normal((min(step, n - start), dim)).astype(np.float32)
            vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
            if first is None:
                first = vecs[0].copy()
            vi.upsert(np.arange(start, start + len(vecs), dtype=np.uint64), vecs)
            del vecs
        held, _peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # The slices' arrays (12,000 x 128 float32 = 6.1 MB) are held once, in the changed vectors'
    # array (which grows by half, so up to 1.5x of them), not a second time as log records.
    assert held < 1.5 * n * dim * 4, f"{held:,} bytes still held for log records"
    vi.save(1)
    again = VectorIndex.load(vi.path, "m", dim)
    # Folded into one flat segment (the base is compaction's to write), not left in the log.
    assert (len(again), again.log_size()["segments"], again.log_size()["records"]) == (n, [n], 0)
    assert again.search(first, 1, exact_below=10**6).keys.tolist() == [0]
    again.compact()
    assert (len(again), again.base_count, again.log_size()["segments"]) == (n, n, [])
    assert again.search(first, 1, exact_below=10**6).keys.tolist() == [0]


def test_a_big_write_over_a_base_folds_removes_and_upserts_whole(base: VectorIndex) -> None:
    base.remove(np.arange(0, 100, dtype=np.uint64))
    for start in range(0, 3000, 512):
        base.upsert(np.arange(20_000 + start, 20_000 + min(start + 512, 3000), dtype=np.uint64),
                    unit(min(512, 3000 - start), start))
    base.upsert(np.arange(100, 110, dtype=np.uint64), unit(10, 77))  # superseded in the base
    base.save(2)
    again = VectorIndex.load(base.path, "m", DIM)
    assert (len(again), again.generation, again.log_size()["records"]) == (2000 - 100 + 3000, 2, 0)
    assert not again.contains(5) and again.contains(105) and again.contains(22_999)
    hit = again.search(unit(10, 77)[3], 1, exact_below=10**6)
    assert hit.keys.tolist() == [103] and hit.similarities[0] > 0.999


def test_opening_an_index_replays_its_log_without_building_a_graph(base: VectorIndex, monkeypatch) -> None:
    """A fresh process (every ``localkb add``) opens the index and replays the log: the changed
    vectors were inserted into an HNSW graph one by one although that graph is only ever searched
    exactly (up to 9,375 insertions at 300,000 passages, seconds per open). Counted: vectors
    inserted into any usearch graph while the log is replayed, and while a write is noted."""
    base.upsert(np.arange(5000, 5500, dtype=np.uint64), unit(500, 2))
    base.remove(np.arange(0, 30, dtype=np.uint64))
    base.save(2)
    inserted = []
    index_cls = vmod._index_class()
    real_add = index_cls.add
    monkeypatch.setattr(index_cls, "add", lambda self, keys, vectors, **kw: (
        inserted.append(len(np.atleast_1d(keys))), real_add(self, keys, vectors, **kw))[1])
    again = VectorIndex.load(base.path, "m", DIM)
    assert (len(again), again.generation) == (2470, 2)
    again.upsert(np.arange(6000, 6010, dtype=np.uint64), unit(10, 3))
    again.save(3)
    assert sum(inserted) == 0, inserted
    hit = again.search(unit(1, 2)[0], 1, exact_below=10**6)  # the first logged vector finds itself
    assert hit.keys.tolist() == [5000] and hit.similarities[0] > 0.999


def _fold_cost(tmp_path: Path, base_n: int, monkeypatch) -> dict:
    """Build a base of ``base_n`` vectors, log the same 1,100 changes, and count what the write
    that folds them costs: vectors read into memory from index files (``Index.load``), vectors
    inserted into a graph, and bytes of index files written."""
    vi = VectorIndex(tmp_path / f"v{base_n}.usearch", "m", DIM)
    vi.build(np.arange(base_n, dtype=np.uint64), unit(base_n, 1), generation=1)
    vi = VectorIndex.load(vi.path, "m", DIM)
    gen = 1
    for start in range(0, 1000, 100):  # appended to the log, not folded
        gen += 1
        vi.upsert(np.arange(10**6 + start, 10**6 + start + 100, dtype=np.uint64), unit(100, gen))
        vi.save(gen)
    vi.remove(np.arange(0, 50, dtype=np.uint64))
    vi.upsert(np.arange(100, 150, dtype=np.uint64), unit(50, 99))
    assert vi._fold_due()
    index_cls = vmod._index_class()
    cost = {"loaded": 0, "inserted": 0, "written": 0}
    real_load, real_add = index_cls.load, index_cls.add

    def load(self, *a, **kw):
        out = real_load(self, *a, **kw)
        cost["loaded"] += len(self)
        return out

    def add(self, keys, vectors, **kw):
        cost["inserted"] += len(np.atleast_1d(keys))
        return real_add(self, keys, vectors, **kw)

    monkeypatch.setattr(index_cls, "load", load)
    monkeypatch.setattr(index_cls, "add", add)
    before = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in tmp_path.iterdir()}
    vi.save(gen + 1)
    monkeypatch.undo()
    cost["written"] = sum(p.stat().st_size for p in tmp_path.iterdir()
                          if before.get(p.name) != (p.stat().st_ino, p.stat().st_mtime_ns))
    again = VectorIndex.load(vi.path, "m", DIM)
    assert (len(again), again.log_size()["records"]) == (base_n - 50 + 1000, 0)
    assert not again.contains(10) and again.contains(120) and again.contains(10**6 + 999)
    hit = again.search(unit(50, 99)[7], 1, exact_below=0)
    assert hit.keys.tolist() == [107] and hit.similarities[0] > 0.999
    for p in list(tmp_path.iterdir()):
        p.unlink()
    return cost


def test_folding_the_log_costs_the_same_at_4x_the_base(tmp_path: Path, monkeypatch) -> None:
    """The write that folds the log into the index costs what was logged, not what the base
    holds: at 300,000 passages it read the whole ~500 MB base into memory and wrote it again
    (1.46 s, 653 MB peak) for ~9,400 changed vectors. Same 1,100 changes over 4,000 and 16,000."""
    small = _fold_cost(tmp_path, 4000, monkeypatch)
    big = _fold_cost(tmp_path, 16000, monkeypatch)
    assert big["inserted"] <= 1.1 * small["inserted"], (small, big)
    assert big["loaded"] <= 1.1 * small["loaded"] + 1100, (small, big)
    assert big["written"] <= 1.1 * small["written"], (small, big)


def test_a_crash_mid_fold_leaves_the_log_in_charge_and_a_missing_segment_is_reported(
        base: VectorIndex, monkeypatch) -> None:
    """A fold writes the segment's files, then the listing (the commit), then an empty log. Killed
    before the listing, the next open replays the log over the files it lists and the next fold
    removes the orphans; a listed segment that is gone or cut short makes the index unavailable
    (the knowledge base rebuilds it from the catalogue) instead of searching without it."""
    limit = vmod.fold_threshold(base.base_count)
    base.upsert(np.arange(50_000, 50_000 + limit // 2, dtype=np.uint64), unit(limit // 2, 3))
    base.save(2)
    base.upsert(np.arange(60_000, 60_000 + limit, dtype=np.uint64), unit(limit, 4))
    base.remove(np.array([1, 2], dtype=np.uint64))

    def killed(*a, **kw):
        raise SystemExit("kill -9")

    monkeypatch.setattr(VectorIndex, "_write_meta", killed)
    with pytest.raises(SystemExit):
        base.save(3)
    monkeypatch.undo()
    orphans = sorted(p.name for p in base.path.parent.glob("v.seg*"))
    assert orphans == ["v.seg1.flat", "v.seg1.gone"]
    again = VectorIndex.load(base.path, "m", DIM)  # the last save that finished: generation 2
    assert (len(again), again.generation, again.log_size()["segments"]) == (2000 + limit // 2, 2, [])
    again.upsert(np.arange(60_000, 60_000 + limit, dtype=np.uint64), unit(limit, 4))
    again.remove(np.array([1, 2], dtype=np.uint64))
    again.save(3)
    listed = again.log_size()["segments"]
    assert listed == [limit // 2 + limit]
    assert sorted(p.name for p in base.path.parent.glob("v.seg*")) == ["v.seg1.flat", "v.seg1.gone"]
    reopened = VectorIndex.load(base.path, "m", DIM)
    assert (len(reopened), reopened.generation) == (2000 - 2 + limit // 2 + limit, 3)
    assert not reopened.contains(1) and reopened.contains(3) and reopened.contains(60_000)
    seg = base.path.parent / "v.seg1.flat"
    seg.write_bytes(seg.read_bytes()[:100])
    with pytest.raises(vmod.IndexUnavailable):
        VectorIndex.load(base.path, "m", DIM)
    seg.unlink()
    with pytest.raises(vmod.IndexUnavailable):
        VectorIndex.load(base.path, "m", DIM)


# -- compaction: merges and base rewrites off the write path ---------------------------------
def _listing(vi: VectorIndex) -> dict:
    import json

    return json.loads(vi.meta_path.read_text())


def _listed_files(path: Path) -> set[str]:
    """Every file the listing names (base and segments)."""
    import json

    meta = json.loads(path.with_suffix(".json").read_text())
    names = {meta.get("base", path.name)}
    for s in meta["segments"]:
        names.add(f"{path.stem}.seg{s['seq']}.{'usearch' if s['graph'] else 'flat'}")
        names.add(f"{path.stem}.seg{s['seq']}.gone")
    return names


def _brute(vecs: dict, q: np.ndarray, k: int) -> list[int]:
    keys = np.array(list(vecs), dtype=np.uint64)
    mat = np.stack(list(vecs.values()))
    return keys[np.argsort(-(mat @ q), kind="stable")[:k]].tolist()


def _assert_equals_brute_force(path: Path, vecs: dict, seed: int) -> None:
    again = VectorIndex.load(path, "m", DIM)
    assert len(again) == len(vecs)
    found = []
    for q in unit(5, seed):
        best = _brute(vecs, q, 10)
        assert again.search(q, 10, exact_below=10**9).keys.tolist() == best
        found.append(len(set(again.search(q, 10, exact_below=0).keys.tolist()) & set(best)))
    assert sum(found) >= 0.9 * 10 * len(found), found
    assert all(Path(path.parent, f).exists() for f in _listed_files(path))


def _writes(vi: VectorIndex, vecs: dict, gen: int, key: int, n: int, *, seed: int) -> tuple[int, int]:
    """One write of ``n`` new vectors, a re-upsert of 20 older keys and 10 deletes; saved."""
    rng = np.random.default_rng(seed)
    new = unit(n, seed + 500)  # not the base's seed: no two keys share a vector (ties)
    vi.upsert(np.arange(key, key + n, dtype=np.uint64), new)
    vecs.update(zip(range(key, key + n), new, strict=True))
    old = rng.choice(np.array(list(vecs), dtype=np.uint64), size=20, replace=False)
    moved = unit(20, seed + 10_000)
    vi.upsert(old, moved)
    vecs.update(zip(old.tolist(), moved, strict=True))
    gone = rng.choice(np.array(list(vecs), dtype=np.uint64), size=10, replace=False)
    vi.remove(gone)
    for k in gone.tolist():
        del vecs[k]
    gen += 1
    vi.save(gen)
    return gen, key + n


@contextmanager
def _compaction_held_at_built(vi: VectorIndex) -> Iterator[dict]:
    """A compaction of ``vi`` on a thread, held once its output is built (before the swap) for
    the block's length, then let go and joined; yields the dict its result lands in."""
    import threading

    built, go, out = threading.Event(), threading.Event(), {}

    def hook(point: str) -> None:
        if point == "built":
            built.set()
            assert go.wait(60)

    worker = threading.Thread(target=lambda: out.update(vmod.compact(vi.path, "m", DIM, hook=hook)))
    worker.start()
    try:
        assert built.wait(120)
        yield out
    finally:
        go.set()
        worker.join(120)


def _merge_due(tmp_path: Path) -> tuple[VectorIndex, dict, int, int]:
    """A 24,000-vector base and FANOUT folds of 1,100 written beside it: a merge is due."""
    return _base_and_folds(tmp_path, 24_000)


def _rewrite_due(tmp_path: Path) -> tuple[VectorIndex, dict, int, int]:
    """A 4,000-vector base and FANOUT folds of 1,100 beside it: they outgrow the base, so a
    base rewrite is due (a merge is capped at a quarter of the base)."""
    return _base_and_folds(tmp_path, 4000)


def _base_and_folds(tmp_path: Path, n: int, after_write: Callable[[VectorIndex, int], None] | None = None,
                    ) -> tuple[VectorIndex, dict, int, int]:
    """An ``n``-vector base and FANOUT folds of 1,100 written beside it (``after_write(vi, i)``
    called after each)."""
    vi = VectorIndex(tmp_path / "v.usearch", "m", DIM)
    vi.build(np.arange(n, dtype=np.uint64), unit(n, 1), generation=1)
    vecs = dict(zip(range(n), unit(n, 1), strict=True))
    gen, key = 1, 10**6
    for i in range(vmod.FANOUT):
        gen, key = _writes(vi, vecs, gen, key, 1100, seed=gen)
        if after_write is not None:
            after_write(vi, i)
    return vi, vecs, gen, key


def test_a_write_that_makes_a_merge_due_only_folds_and_compaction_merges(tmp_path: Path) -> None:
    def no_graph_written(_vi: VectorIndex, i: int) -> None:
        assert not list(tmp_path.glob("v.seg*.usearch")), i  # no graph written by a write

    # Fold line 1,024; a merge of four 1,100-vector folds is under a quarter of the base.
    vi, vecs, gen, _key = _base_and_folds(tmp_path, 24_000, no_graph_written)
    assert [s["graph"] for s in _listing(vi)["segments"]] == [False] * vmod.FANOUT
    plan = vi.compaction_plan()
    assert plan is not None and plan["kind"] == "merge" and len(plan["seqs"]) == vmod.FANOUT
    layout = _listing(vi)["layout"]
    result = vmod.compact(vi.path, "m", DIM)
    assert [s["state"] for s in result["steps"]] == ["swapped"]
    listing = _listing(vi)
    assert [s["graph"] for s in listing["segments"]] == [True] and listing["layout"] == layout + 1
    assert listing["generation"] == gen  # the content did not change
    assert VectorIndex.load(vi.path, "m", DIM).compaction_plan() is None
    _assert_equals_brute_force(vi.path, vecs, 7)
    assert len(list(tmp_path.glob("v.seg*"))) == 2  # the merged-away flat segments are gone


def test_a_write_that_makes_a_base_rewrite_due_only_folds_and_compaction_rewrites(tmp_path: Path) -> None:
    n = 4000  # a merge is capped at a quarter of the base (1,000): four folds outgrow the base
    vi = VectorIndex(tmp_path / "v.usearch", "m", DIM)
    vi.build(np.arange(n, dtype=np.uint64), unit(n, 1), generation=1)
    vecs = dict(zip(range(n), unit(n, 1), strict=True))
    before = vi.path.stat()
    gen, key = 1, 10**6
    for _ in range(4):
        gen, key = _writes(vi, vecs, gen, key, 1100, seed=gen)
    after = vi.path.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)  # not rewritten
    assert len(_listing(vi)["segments"]) == 4
    plan = vi.compaction_plan()
    assert plan is not None and plan["kind"] == "rewrite"
    result = vmod.compact(vi.path, "m", DIM)
    assert [s["kind"] for s in result["steps"]] == ["rewrite"]
    listing = _listing(vi)
    assert listing["segments"] == [] and listing["count"] == len(vecs) and listing["generation"] == gen
    _assert_equals_brute_force(vi.path, vecs, 8)
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == sorted(
        _listed_files(vi.path) | {"v.json", "v.log"})


def test_a_fold_that_lands_while_a_compaction_builds_is_kept_by_the_swap(tmp_path: Path) -> None:
    vi, vecs, gen, key = _merge_due(tmp_path)
    run_keys = list(range(10**6, 10**6 + 50))  # in the run being merged
    with _compaction_held_at_built(vi) as out:
        # Meanwhile a write folds: it moves keys the run holds, deletes others (some in the run,
        # some in the base) and adds new ones.
        moved = unit(25, 4242)
        vi.upsert(np.array(run_keys[:25], dtype=np.uint64), moved)
        vecs.update(zip(run_keys[:25], moved, strict=True))
        dead = [k for k in run_keys[25:] if k in vecs][:10] + [k for k in range(500, 520) if k in vecs]
        vi.remove(np.array(dead, dtype=np.uint64))
        for k in dead:
            del vecs[k]
        gen, key = _writes(vi, vecs, gen, key, 1100, seed=gen)
        assert len(_listing(vi)["segments"]) == vmod.FANOUT + 1
    assert [s["state"] for s in out["steps"]] == ["swapped"]
    listing = _listing(vi)
    assert [s["graph"] for s in listing["segments"]] == [True, False]  # the fold's segment kept, after
    _assert_equals_brute_force(vi.path, vecs, 9)
    again = VectorIndex.load(vi.path, "m", DIM)
    assert not any(again.contains(k) for k in dead)
    for k, v in zip(run_keys[:25], moved, strict=True):
        hit = again.search(v, 1, exact_below=10**9)
        assert hit.keys.tolist() == [k] and hit.similarities[0] > 0.999
    # The writer's copy opened the files before the swap: its next fold lists only files that exist.
    for _ in range(2):
        gen, key = _writes(vi, vecs, gen, key, 1100, seed=gen)
        assert all((tmp_path / f).exists() for f in _listed_files(vi.path))
    _assert_equals_brute_force(vi.path, vecs, 10)


_STALE = r"""
import sys
from pathlib import Path
import numpy as np
from localkb.store.vectors import VectorIndex
path, dim = Path(sys.argv[1]), int(sys.argv[2])
vi = VectorIndex.load(path, "m", dim)
print("opened", flush=True)
sys.stdin.readline()  # a compaction swaps the files meanwhile
rng = np.random.default_rng(3)
v = rng.standard_normal((1100, dim)).astype(np.float32)
v /= np.linalg.norm(v, axis=1, keepdims=True)
vi.upsert(np.arange(2 * 10**6, 2 * 10**6 + 1100, dtype=np.uint64), v)
vi.remove(np.arange(0, 30, dtype=np.uint64))
vi.save(vi.generation + 1)
np.save(sys.argv[3], v)
print("written", flush=True)
"""


def test_a_stale_copy_in_another_process_writes_after_a_compaction_without_listing_deleted_files(
        tmp_path: Path) -> None:
    import subprocess
    import sys

    vi, vecs, _gen, _key = _merge_due(tmp_path)
    proc = subprocess.Popen([sys.executable, "-c", _STALE, str(vi.path), str(DIM), str(tmp_path / "v.npy")],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "opened"
        layout = _listing(vi)["layout"]
        result = vmod.compact(vi.path, "m", DIM)
        assert [s["state"] for s in result["steps"]] == ["swapped"]
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "written"
    finally:
        proc.stdin.close()
        assert proc.wait(60) == 0
    added = np.load(tmp_path / "v.npy")
    vecs.update(zip(range(2 * 10**6, 2 * 10**6 + 1100), added, strict=True))
    for k in range(30):
        vecs.pop(k, None)
    listing = _listing(vi)
    assert listing["layout"] == layout + 1 and [s["graph"] for s in listing["segments"]] == [True, False]
    _assert_equals_brute_force(vi.path, vecs, 11)


_KILLED = r"""
import os, signal, sys
from pathlib import Path
from localkb.store import vectors
where = sys.argv[3]
def hook(point):
    if point == where:
        os.kill(os.getpid(), signal.SIGKILL)
vectors.compact(Path(sys.argv[1]), "m", int(sys.argv[2]), hook=hook)
"""


@pytest.mark.parametrize("kind", ["merge", "rewrite"])
@pytest.mark.parametrize("point", ["built", "renamed"])
def test_a_compaction_killed_mid_way_leaves_the_index_valid(tmp_path: Path, point: str, kind: str) -> None:
    """kill -9 after the output is built, and after it is renamed into place but before the
    listing names it: for a merge of segments and for a rewrite of the base (whose new file
    has a new name beside the listed one), the old listing stands and answers exactly."""
    import subprocess
    import sys

    from localkb.atomic import sweep_tmp

    vi, vecs, gen, key = (_merge_due if kind == "merge" else _rewrite_due)(tmp_path)
    assert vi.compaction_plan()["kind"] == kind
    listed = _listing(vi)
    done = subprocess.run([sys.executable, "-c", _KILLED, str(vi.path), str(DIM), point], check=False)
    assert done.returncode == -9
    assert _listing(vi) == listed  # the old listing stands
    _assert_equals_brute_force(vi.path, vecs, 12)
    left = [p.name for p in tmp_path.iterdir() if p.name.startswith(".") and p.name.endswith(".tmp")]
    assert bool(left) == (point == "built")  # built, not yet renamed: the dead process's tmp files
    unlisted = {p.name for p in tmp_path.glob("v.seg*")} - _listed_files(vi.path)
    assert bool(unlisted) == (point == "renamed"), unlisted  # renamed in, never listed
    sweep_tmp(tmp_path, tmp_path / "none")
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    # A compaction after it does the work; orphans a kill left are never listed, and go.
    result = vmod.compact(vi.path, "m", DIM)
    assert [s["state"] for s in result["steps"]] == ["swapped"]
    gen, key = _writes(vi, vecs, gen, key, 1100, seed=gen)
    _assert_equals_brute_force(vi.path, vecs, 13)
    assert {p.name for p in tmp_path.glob("v.seg*")} <= _listed_files(vi.path)


def test_one_compaction_at_a_time(tmp_path: Path) -> None:
    vi, _vecs, _gen, _key = _merge_due(tmp_path)
    with _compaction_held_at_built(vi) as out:
        assert vmod.compact(vi.path, "m", DIM)["state"] == "already running"
    assert out["state"] == "compacted"


@pytest.mark.parametrize("kind", ["merge", "rewrite"])
def test_an_open_that_races_a_compaction_swap_reads_the_new_listing(tmp_path: Path, monkeypatch,
                                                                     kind: str) -> None:
    # A reader that takes no store lock (``doctor``, a second process) reads the listing, then
    # a compaction in another process swaps the files and deletes the ones that listing named,
    # then the reader maps them: the open must follow the new listing, not report the index
    # unreadable (CI caught ``doctor`` doing so after a ``localkb add`` left a compaction running).
    vi, vecs, _gen, _key = (_merge_due if kind == "merge" else _rewrite_due)(tmp_path)
    real = vmod.read_json
    raced = []

    def listing_then_swap(path: Path):
        meta = real(path)
        if not raced and path == vi.meta_path:
            raced.append(True)
            monkeypatch.setattr(vmod, "read_json", real)
            assert vmod.compact(vi.path, "m", DIM)["state"] == "compacted"
            monkeypatch.setattr(vmod, "read_json", listing_then_swap)
        return meta

    monkeypatch.setattr(vmod, "read_json", listing_then_swap)
    again = VectorIndex.load(vi.path, "m", DIM)
    assert raced and again.layout == _listing(vi)["layout"]
    monkeypatch.setattr(vmod, "read_json", real)
    assert len(again) == len(vecs)
    q = unit(1, 77)[0]
    assert again.search(q, 10, exact_below=10**9).keys.tolist() == _brute(vecs, q, 10)


# -- a rebuild lists its vectors flat: the graph is compaction's --------------------------

def _flat_base(tmp_path: Path, n: int, *, part: int = 700) -> tuple[VectorIndex, dict]:
    """A rebuild of ``n`` vectors, fed in parts as the catalogue streams them."""
    vi = VectorIndex(tmp_path / "v.usearch", "m", DIM)
    vecs = unit(n, 1)
    vi.build_flat(((np.arange(s, min(s + part, n), dtype=np.uint64), vecs[s : s + part])
                   for s in range(0, n, part)), generation=1)
    return vi, dict(zip(range(n), vecs, strict=True))


def test_a_rebuild_builds_no_graph_and_answers_exactly_until_compaction_builds_it(tmp_path: Path) -> None:
    """An import's first open (and a repair) rebuilds the index from the catalogue; building the
    graph there was 52 % of an import (py-spy, 10,000 passages). The rebuild lists the vectors as
    a flat base, searched exactly, and leaves the graph to compaction, as writes leave merges."""
    vi, vecs = _flat_base(tmp_path, 3000)
    assert not list(tmp_path.glob("*.usearch")), "the rebuild built a graph"
    listing = _listing(vi)
    assert (listing["base_graph"], listing["count"], listing["generation"]) == (False, 3000, 1)
    opened = VectorIndex.load(vi.path, "m", DIM)
    assert len(opened) == 3000 and opened.contains(2999) and not opened.contains(3000)
    for q in unit(5, 7):
        hits = opened.search(q, 10, exact_below=0)  # exact, though the caller would take the graph
        assert hits.exact and hits.keys.tolist() == _brute(vecs, q, 10)
    plan = opened.compaction_plan()
    assert plan is not None and plan["kind"] == "graph"
    result = vmod.compact(vi.path, "m", DIM)
    assert [(s["kind"], s["state"]) for s in result["steps"]] == [("graph", "swapped")]
    listing = _listing(vi)
    assert (listing["base_graph"], listing["count"], listing["generation"]) == (True, 3000, 1)
    assert VectorIndex.load(vi.path, "m", DIM).compaction_plan() is None
    _assert_equals_brute_force(vi.path, vecs, 8)
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == sorted(
        _listed_files(vi.path) | {"v.json", "v.log"})  # the flat base went with its listing


def test_writes_over_a_flat_base_fold_beside_it_and_its_graph_keeps_them(tmp_path: Path) -> None:
    vi, vecs = _flat_base(tmp_path, 3000)
    vi = VectorIndex.load(vi.path, "m", DIM)
    gen, key = 1, 10**6
    for _ in range(2):  # each moves and deletes keys the flat base holds, and folds
        gen, key = _writes(vi, vecs, gen, key, 1100, seed=gen)
    assert [s["graph"] for s in _listing(vi)["segments"]] == [False, False]
    _assert_equals_brute_force(vi.path, vecs, 9)
    assert VectorIndex.load(vi.path, "m", DIM).compaction_plan()["kind"] == "graph"
    assert vmod.compact(vi.path, "m", DIM)["state"] == "compacted"
    listing = _listing(vi)
    assert (listing["base_graph"], listing["segments"], listing["count"]) == (True, [], len(vecs))
    _assert_equals_brute_force(vi.path, vecs, 10)


def test_a_rebuild_that_fails_part_way_leaves_the_listed_index_whole(tmp_path: Path) -> None:
    from localkb.errors import IndexUnavailable

    vi, vecs = _flat_base(tmp_path, 1000)
    listed = _listing(vi)

    def parts() -> Iterator[tuple[np.ndarray, np.ndarray]]:
        yield np.arange(5000, 5100, dtype=np.uint64), unit(100, 3)
        raise OSError("disk full (the test's)")

    with pytest.raises(IndexUnavailable, match="disk full"):
        VectorIndex(vi.path, "m", DIM).build_flat(parts(), generation=2)
    assert _listing(vi) == listed
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    _assert_equals_brute_force(vi.path, vecs, 11)
