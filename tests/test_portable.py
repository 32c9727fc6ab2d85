"""Portable knowledge bases: .awkb round trips, hostile files, encryption, and the host messages."""

from __future__ import annotations

import base64
import copy
import gzip
import hashlib
import io
import json
import random
import re
import shutil
import sys
import time
import zlib
from pathlib import Path

import numpy as np
import pytest

from conftest import make_pdf, run_cli
from hostproc import HostProcess
from localkb.doctor import doctor
from localkb.errors import Conflict, DecryptionFailed, InvalidArchive, PassphraseRequired
from localkb.ingest.extract import extract_text
from localkb.ingest.pipeline import add_document, add_paths, list_sources
from localkb.native.protocol import MAX_OUTGOING
from localkb.portable import envelope
from localkb.portable.archive import Limits, export_kb, export_to_file, import_kb
from localkb.retrieval.search import Searcher
from localkb.store.catalog import blob_vector

TOPICS = [
    "Sourdough bread rises because wild yeast and lactobacilli ferment the flour overnight.",
    "The Rust borrow checker rejects two mutable references to the same value at once.",
    "Photosynthesis in chloroplasts turns light, water and carbon dioxide into sugar.",
    "A lighthouse keeper trims the wick and winds the clockwork that turns the lens.",
    "Tidal locking keeps the same face of the Moon turned towards the Earth.",
]


def _fill(kb, n: int = len(TOPICS), repeat: int = 6) -> None:
    for i in range(n):
        text = " ".join(f"{TOPICS[i % len(TOPICS)]} Note {i}.{j}." for j in range(repeat))
        add_document(kb, extract_text(text, title=f"Note {i}", url=f"https://example.org/n/{i}"),
                     key=f"https://example.org/n/{i}", captured_by="context-menu")


def _export_bytes(kb) -> bytes:
    buf = io.BytesIO()
    export_kb(kb, buf)
    return buf.getvalue()


def _chunks(store, kb_id: str) -> list[tuple]:
    rows = store.catalog.db.execute(
        "SELECT s.key, c.idx, c.text, c.page, c.tokens, c.text_hash, c.indexed_by, c.indexed_at, c.vector "
        "FROM chunks c JOIN sources s ON s.id = c.source_id WHERE c.kb_id = ? ORDER BY s.key, c.idx",
        (kb_id,)).fetchall()
    return [tuple(r) for r in rows]


def _hits(res) -> list[tuple]:
    return [(h.title, h.url, h.file_name, h.chunk_index, h.chunk_count, h.page, h.text,
             round(h.score, 6), h.cosine, h.bm25, tuple(h.lists)) for h in res.hits + res.weaker]


# -- round trip ---------------------------------------------------------------------

def test_round_trip_gives_same_results_scores_provenance_and_pdf_pages(store, kb, tmp_path):
    _fill(kb)
    pdf = make_pdf(tmp_path / "manual.pdf", ["The boiler manual says: bleed the radiators first.",
                                             "Page two explains the pressure gauge and the valve.",
                                             "Page three lists the service intervals for the pump."])
    assert add_paths(kb, [str(pdf)]).totals()["sources_failed"] == 0
    path = tmp_path / "docs.awkb"
    report = export_to_file(kb, path)
    assert report.bytes == path.stat().st_size
    assert report.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert gzip.decompress(path.read_bytes()).startswith(b'{"format":"awkb","version":1')

    imported = import_kb(store, path)
    new = imported.knowledge_base
    assert new["name"] == "Docs (2)" and new["model"] == kb.record.model and new["dim"] == 384
    assert (imported.sources, imported.chunks) == (6, store.catalog.counts(kb.id)["chunks"])

    def provenance(kb_id):
        rows, _ = list_sources(store.open_kb(kb_id), limit=100)
        return sorted((r["title"], r["url"], r["file_name"], r["type"], r["chunks"], r["chunk_count"],
                       r["pages"], r["captured_by"], r["added_at"], r["updated_at"]) for r in rows)

    assert provenance(new["id"]) == provenance(kb.id)
    assert _chunks(store, new["id"]) == _chunks(store, kb.id)  # text, page, hashes, vector bytes
    pages = [r[3] for r in _chunks(store, new["id"]) if r[0].endswith("manual.pdf")]
    assert pages == [1, 2, 3]

    # Whoosh's BM25 statistics depend on how a keyword index grew (segments, merges), so
    # the original's is rebuilt in one go like the import's: both derive from the catalogue.
    kb.close()
    shutil.rmtree(kb.keyword_path)
    kb.keyword_path.with_suffix(".json").unlink()
    searcher = Searcher(store)
    for query in ("why does sourdough rise", "pressure gauge valve", "borrow checker mutable"):
        before = searcher.search([kb.id], query, k=8)
        after = searcher.search([new["id"]], query, k=8)
        assert before.hits, query
        assert _hits(after) == _hits(before), query
    assert doctor(store)["clean"]


def test_import_takes_a_free_name_or_the_given_one(store, kb, tmp_path):
    _fill(kb, 2)
    data = _export_bytes(kb)
    assert import_kb(store, io.BytesIO(data)).knowledge_base["name"] == "Docs (2)"
    assert import_kb(store, io.BytesIO(data)).knowledge_base["name"] == "Docs (3)"
    assert import_kb(store, io.BytesIO(data), name="Moved").knowledge_base["name"] == "Moved"
    with pytest.raises(Conflict):
        import_kb(store, io.BytesIO(data), name="moved")
    assert [r.name for r in store.kbs()] == ["Docs", "Docs (2)", "Docs (3)", "Moved"]


def test_cli_export_and_import(tmp_path, store):
    home = store.root
    store.create_kb("Hashed", model="hashing-256", privacy="cloud")
    _fill(store.open_kb("Hashed"), 3)
    out = tmp_path / "h.awkb"
    res = run_cli(["export", "Hashed", "-o", str(out), "--json"], home)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["chunks"] == store.catalog.counts(store.resolve("Hashed").id)["chunks"]
    res = run_cli(["import", str(out), "--name", "Hashed copy", "--json"], home)
    assert res.returncode == 0, res.stderr
    made = json.loads(res.stdout)["knowledge_base"]
    assert (made["name"], made["privacy"], made["model"]) == ("Hashed copy", "cloud", "hashing-256")
    bad = tmp_path / "bad.awkb"
    bad.write_bytes(out.read_bytes()[:-20])
    res = run_cli(["import", str(bad)], home)
    assert res.returncode == 2 and "invalid_archive" in res.stderr and "truncated" in res.stderr


# -- refusals -------------------------------------------------------------------------

def _doc(data: bytes) -> dict:
    return json.loads(gzip.decompress(data))


def _pack(doc: dict) -> bytes:
    return gzip.compress(json.dumps(doc).encode())


@pytest.fixture
def hashed(store):
    store.create_kb("Small", model="hashing-256")
    kb = store.open_kb("Small")
    _fill(kb, 3, repeat=40)
    return kb


def _refused(store, data: bytes, limits: Limits | None = None) -> str:
    before = [r.id for r in store.kbs()]
    with pytest.raises(InvalidArchive) as err:
        import_kb(store, io.BytesIO(data), limits=limits or Limits())
    assert [r.id for r in store.kbs()] == before
    assert err.value.code == "invalid_archive"
    return str(err.value)


def test_unknown_model_is_refused_clearly(store, hashed):
    doc = _doc(_export_bytes(hashed))
    doc["model"] = {"id": "e5-mistral-7b", "dim": 4096, "normalised": True}
    msg = _refused(store, _pack(doc))
    assert msg.startswith("model 'e5-mistral-7b' is not known to this host (known: all-MiniLM-L6-v2, "
                          "hashing-256)")


def test_wrong_vector_length_names_the_chunk_and_both_dimensions(store, hashed):
    doc = _doc(_export_bytes(hashed))
    assert len(doc["chunks"]) > 2
    vec = np.frombuffer(base64.b64decode(doc["chunks"][1]["vector"]), "<f4")[:255]
    doc["chunks"][1]["vector"] = base64.b64encode((vec / np.linalg.norm(vec)).astype("<f4")).decode()
    assert _refused(store, _pack(doc)) == "chunk 1: vector has 255 dimensions, this model has 256"


def _mutations(doc: dict) -> list[tuple[str, dict]]:
    """Documents each wrong in one known way (every field of every item, several ways)."""
    out: list[tuple[str, dict]] = []

    def put(label, fn):
        d = copy.deepcopy(doc)
        fn(d)
        out.append((label, d))

    def setter(path, value):
        def fn(d):
            target = d
            for p in path[:-1]:
                target = target[p]
            if value is _DELETE:
                del target[path[-1]]
            else:
                target[path[-1]] = value
        return fn

    long = "x" * 9000
    for key in ("format", "version", "model", "kb", "sources", "chunks", "counts"):
        put(f"no {key}", setter([key], _DELETE))
        put(f"{key} wrong type", setter([key], 3.5))
    for value in ("awkc", None, 1):
        put(f"format {value}", setter(["format"], value))
    for value in (0, 2, "1", True, None):
        put(f"version {value}", setter(["version"], value))
    for key, values in (("id", ["nope", None, 1, long]), ("dim", [384, 0, "256", None, True]),
                        ("normalised", [False, None, "true", 1])):
        for value in values:
            put(f"model.{key}={value!r:.20}", setter(["model", key], value))
    for key, values in (("name", ["", "a/b", "x" * 81, None, 5, "\x01"]),
                        ("privacy", ["public", None, 1, ""])):
        for value in values:
            put(f"kb.{key}={value!r:.20}", setter(["kb", key], value))
    for key in ("sources", "chunks"):
        for value in (-1, len(doc[key]) + 1, len(doc[key]) - 1, "3", None):
            put(f"counts.{key}={value!r}", setter(["counts", key], value))
    src_bad = {"id": [None, 1, "", "x" * 65], "key": [None, 1, "", long], "type": [None, 1, "x" * 33],
               "title": [None, 1, long], "url": [1, long, []], "file_name": [1, long],
               "content_hash": [None, 1, ""], "captured_by": [None, 1, "x" * 41],
               "chunk_count": [None, -1, "1", 1.5, True], "pages": [-1, "2", 1.5],
               "lang": [1, "x" * 36], "added_at": [None, "now", True, 1e300],
               "updated_at": [None, "now", False]}
    for i in range(len(doc["sources"])):
        for key, values in src_bad.items():
            if key in ("id", "key", "type", "content_hash", "captured_by", "chunk_count", "added_at",
                       "updated_at", "title"):
                put(f"source {i} no {key}", setter(["sources", i, key], _DELETE))
            for value in values:
                put(f"source {i} {key}={value!r:.20}", setter(["sources", i, key], value))
        put(f"source {i} not an object", setter(["sources", i], [1]))
    if len(doc["sources"]) > 1:
        put("duplicate source id", setter(["sources", 1, "id"], doc["sources"][0]["id"]))
        put("duplicate source key", setter(["sources", 1, "key"], doc["sources"][0]["key"]))
    dim = doc["model"]["dim"]
    unit = np.full(dim, 1 / np.sqrt(dim), dtype="<f4")

    def b64(arr) -> str:
        return base64.b64encode(np.asarray(arr, dtype="<f4").tobytes()).decode()

    nan = unit.copy()
    nan[3] = np.nan
    inf = unit.copy()
    inf[0] = np.inf
    bad_vectors = [b64(unit[:-1] * 1.0005), b64(np.append(unit, 0)), b64(np.zeros(dim)), b64(nan),
                   b64(inf), b64(unit * 2), b64(unit)[:-4], b64(unit) + "AAAA", "!!" + b64(unit)[2:],
                   base64.b64encode(unit.tobytes() + b"\x00").decode(), None, 5, [0.1] * dim, ""]
    chunk_bad = {"id": [None, 1, "", "x" * 65], "source": [None, 1, "nosuch"],
                 "index": [None, -1, "0", 1.5, 10**6], "text": [None, 1, "", "y" * (64 * 1024 + 1)],
                 "page": [-1, "1"], "tokens": [None, -1, "3"], "text_hash": [None, 1, "0" * 32],
                 "indexed_by": [None, 1, "x" * 41], "indexed_at": [None, "then"],
                 "vector": bad_vectors}
    for i in range(len(doc["chunks"])):
        for key, values in chunk_bad.items():
            if key not in ("page",):
                put(f"chunk {i} no {key}", setter(["chunks", i, key], _DELETE))
            for value in values:
                put(f"chunk {i} {key}={value!r:.20}", setter(["chunks", i, key], value))
        put(f"chunk {i} text changed", setter(["chunks", i, "text"], doc["chunks"][i]["text"] + "!"))
        put(f"chunk {i} not an object", setter(["chunks", i], "chunk"))
    if len(doc["chunks"]) > 1:
        put("duplicate chunk id", setter(["chunks", 1, "id"], doc["chunks"][0]["id"]))
        first = doc["chunks"][0]
        put("duplicate chunk position", lambda d: d["chunks"][1].update(
            {k: first[k] for k in ("source", "index", "text", "text_hash")}))
    put("source title changed under its chunks",
        setter(["sources", 0, "title"], doc["sources"][0]["title"] + " (edited)"))
    return out


_DELETE = object()


def test_an_archive_refused_for_a_far_future_indexed_at_leaves_no_file_behind(store, hashed, tmp_path):
    """``indexed_at`` 9223372036854775 (2**63 ms as seconds), plain and encrypted, through the CLI
    and through the host's upload: each is refused with ``invalid_archive`` naming the field, and
    once the host has exited the data directory holds exactly what it held before (logs aside)."""
    doc = _doc(_export_bytes(hashed))
    doc["chunks"][0]["indexed_at"] = 9223372036854775
    plain = tmp_path / "far.awkb"
    plain.write_bytes(_pack(doc))
    sealed = tmp_path / "far-sealed.awkb"
    with open(plain, "rb") as src, open(sealed, "wb") as dst:
        envelope.seal(src, dst, "s3cret")

    def files() -> list[str]:
        return sorted(str(p.relative_to(store.root)) for p in store.root.rglob("*") if "logs" not in p.parts)

    before = files()
    for path in (plain, sealed):
        res = run_cli(["import", str(path), "--json"], store.root, env={"LOCALKB_PASSPHRASE": "s3cret"})
        err = json.loads(res.stdout)["error"]
        assert res.returncode != 0 and err["code"] == "invalid_archive", res.stdout
        assert "indexed_at" in err["message"]
    with HostProcess([sys.executable, "-m", "localkb", "host"], home=store.root) as host:
        up = host.request({"id": 1, "type": "kb.import", "data": {"action": "begin"}})["result"]["upload"]
        assert host.request({"id": 2, "type": "kb.import", "data": {
            "action": "part", "upload": up, "index": 0,
            "data_base64": base64.b64encode(plain.read_bytes()).decode()}})["ok"]
        reply = host.request({"id": 3, "type": "kb.import", "data": {"action": "commit", "upload": up}})
        assert reply["error"]["code"] == "invalid_archive" and "indexed_at" in reply["error"]["message"]
    assert [r.name for r in store.kbs()] == ["Small"]
    assert files() == before


def test_fuzz_over_a_thousand_bad_archives_are_each_refused_and_leave_no_trace(store, hashed):
    rng = random.Random(6)
    good = _export_bytes(hashed)
    doc = _doc(good)
    limits = Limits(max_compressed=256 * 1024, max_decompressed=1024 * 1024, max_text=64 * 1024)
    cases: list[tuple[str, bytes]] = [(label, _pack(d)) for label, d in _mutations(doc)]
    text = json.dumps(doc).encode()
    for n in range(150):  # JSON cut short anywhere, then gzipped properly
        cases.append((f"json cut {n}", gzip.compress(text[: rng.randrange(0, len(text))])))
    for n in range(150):  # the gzip stream cut short anywhere
        cases.append((f"gzip cut {n}", good[: rng.randrange(0, len(good))]))
    raw = gzip.decompress(good)
    flips = 0
    while flips < 200:  # one bit changed past the header's mtime/os fields
        pos = rng.randrange(10, len(good))
        flipped = bytearray(good)
        flipped[pos] ^= 1 << rng.randrange(8)
        try:
            same = gzip.decompress(bytes(flipped)) == raw
        except (OSError, EOFError, zlib.error):
            same = False
        if same:  # a padding bit of the last deflate byte: the same archive, not a bad one
            continue
        cases.append((f"flip {pos}", bytes(flipped)))
        flips += 1
    for n in range(30):
        cases.append((f"noise {n}", rng.randbytes(rng.randrange(1, 4000))))
    cases += [
        ("empty", b""),
        ("not gzip", b'{"format": "awkb"}'),
        ("json array", gzip.compress(b"[1, 2, 3]")),
        ("json null", gzip.compress(b"null")),
        ("invalid utf-8", gzip.compress(text[:50] + b"\xff\xfe" + text[50:])),
        ("NaN constant", gzip.compress(text.replace(b'"version": 1', b'"version": NaN', 1))),
        ("deep nesting", gzip.compress(b"[" * 200_000 + b"]" * 200_000)),
        ("huge integer", gzip.compress(b'{"format": "awkb", "version": ' + b"9" * 5000 + b"}")),
        ("trailing garbage", good + b"more"),
        ("two gzip members", good + good),
        ("bomb of zeros", gzip.compress(b"\x00" * (4 * 1024 * 1024), 9)),
        ("bomb of spaces", gzip.compress(b" " * (8 * 1024 * 1024) + text, 9)),
        ("bomb in a valid document", _pack({**doc, "padding": "z" * (2 * 1024 * 1024)})),
        ("oversized file", good + rng.randbytes(300 * 1024)),
        ("encrypted header only", envelope.MAGIC + b"\x01"),
        ("envelope of an unknown version", envelope.MAGIC + b"\x09" + bytes(60)),
        ("envelope asking for too much memory", envelope.HEADER.pack(
            envelope.MAGIC, 1, 20, 16, 1, bytes(16), bytes(12)) + bytes(40)),
    ]
    assert len(cases) >= 1000, len(cases)
    kb_ids = [r.id for r in store.kbs()]
    files_before = sorted(p.relative_to(store.root) for p in store.root.rglob("*")
                          if "logs" not in p.parts)
    messages = set()
    for label, data in cases:
        try:
            import_kb(store, io.BytesIO(data), limits=limits)
        except InvalidArchive as err:
            assert str(err), label
            messages.add(re.sub(r"\d[\d,]*", "N", str(err))[:60])
        else:
            pytest.fail(f"accepted a bad archive: {label}")
        assert [r.id for r in store.kbs()] == kb_ids, label
    assert len(messages) > 40  # the messages name many distinct problems, not one catch-all
    files_after = sorted(p.relative_to(store.root) for p in store.root.rglob("*") if "logs" not in p.parts)
    assert files_after == files_before
    assert import_kb(store, io.BytesIO(good), limits=limits).chunks == len(doc["chunks"])
    assert doctor(store)["clean"]


def test_a_bomb_stops_at_the_cap_without_inflating_it(store):
    # 64 MiB of JSON whitespace from ~64 KiB: valid so far, so only the cap stops it.
    bomb = gzip.compress(b" " * (64 * 1024 * 1024), 9)
    limits = Limits(max_decompressed=1024 * 1024)
    with pytest.raises(InvalidArchive, match="decompresses to more than 1,048,576 bytes"):
        import_kb(store, io.BytesIO(bomb), limits=limits)
    assert store.kbs() == []


# -- encryption ---------------------------------------------------------------------

def test_encrypted_round_trip_wrong_passphrase_and_tampering(store, hashed, tmp_path):
    path = tmp_path / "secret.awkb"
    rep = export_to_file(hashed, path, passphrase="correct horse")
    data = path.read_bytes()
    assert rep.encrypted and data.startswith(envelope.MAGIC)
    assert b"Sourdough" not in data and b"Note 0" not in data
    kbs_before = [r.id for r in store.kbs()]
    with pytest.raises(PassphraseRequired) as err:
        import_kb(store, path)
    assert err.value.code == "passphrase_required"
    with pytest.raises(DecryptionFailed, match="wrong passphrase"):
        import_kb(store, path, passphrase="battery staple")
    for pos in (12, 30, len(data) // 2, len(data) - 1):  # scrypt params/salt, nonce, body, tag
        tampered = bytearray(data)
        tampered[pos] ^= 0x40
        with pytest.raises((DecryptionFailed, InvalidArchive)):
            import_kb(store, io.BytesIO(bytes(tampered)), passphrase="correct horse")
    with pytest.raises(DecryptionFailed):
        import_kb(store, io.BytesIO(data[:-1]), passphrase="correct horse")
    assert [r.id for r in store.kbs()] == kbs_before
    assert list(store.root.glob("tmp*")) == []
    made = import_kb(store, path, passphrase="correct horse")
    assert _chunks(store, made.knowledge_base["id"]) == _chunks(store, hashed.id)


def test_cli_encrypts_with_the_passphrase_from_the_environment(store, hashed, tmp_path):
    out = tmp_path / "e.awkb"
    env = {"LOCALKB_PASSPHRASE": "s3cret"}
    res = run_cli(["export", "Small", "-o", str(out), "--encrypt"], store.root, env=env)
    assert res.returncode == 0, res.stderr
    assert out.read_bytes().startswith(envelope.MAGIC)
    res = run_cli(["import", str(out), "--json"], store.root)  # no terminal, no variable
    assert res.returncode == 8 and json.loads(res.stdout)["error"]["code"] == "passphrase_required"
    res = run_cli(["import", str(out), "--json"], store.root, env={"LOCALKB_PASSPHRASE": "nope"})
    assert res.returncode == 8 and json.loads(res.stdout)["error"]["code"] == "decryption_failed"
    assert len(store.kbs()) == 1
    res = run_cli(["import", str(out), "--json"], store.root, env=env)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["knowledge_base"]["name"] == "Small (2)"


# -- host messages -----------------------------------------------------------------

def _synthetic(n_chunks: int, *, per_source: int = 100, words_per_chunk: int = 20, seed: int = 1,
               dense: bool = False) -> bytes:
    """A valid .awkb for the hashing model with ``n_chunks`` chunks of random words."""
    from localkb.embedding.embedder import HashingEmbedder
    from localkb.ingest.chunk import passage_text

    rng = random.Random(seed)
    words = [f"w{n}" for n in range(5000)]
    sources, chunks = [], []
    for start in range(0, n_chunks, per_source):
        count = min(per_source, n_chunks - start)
        sid, title = f"s{start}", f"Random {start}"
        sources.append({"id": sid, "key": f"text:{start}", "type": "text", "title": title, "url": None,
                        "file_name": None, "content_hash": "0" * 64, "captured_by": "cli",
                        "chunk_count": count, "pages": None, "lang": None, "added_at": 1.0e9,
                        "updated_at": 1.0e9})
        for i in range(count):
            text = " ".join(rng.choice(words) for _ in range(words_per_chunk))
            passage = passage_text(title, text)
            digest = hashlib.sha256(passage.encode()).hexdigest()[:32]
            chunks.append({"id": f"c{start}-{i}", "source": sid, "index": i, "text": text, "page": None,
                           "tokens": words_per_chunk, "text_hash": digest,
                           "indexed_by": "cli", "indexed_at": 1.0e9, "_passage": passage})
    if dense:  # random unit vectors: they do not compress, so the file size is predictable
        vecs = np.random.default_rng(seed).standard_normal((len(chunks), 256)).astype(np.float32)
        vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
        for c in chunks:
            del c["_passage"]
    else:
        vecs = HashingEmbedder().embed([c.pop("_passage") for c in chunks])
    for c, v in zip(chunks, vecs, strict=True):
        c["vector"] = base64.b64encode(v.astype("<f4").tobytes()).decode()
    return _pack({"format": "awkb", "version": 1, "model": {"id": "hashing-256", "dim": 256,
                                                             "normalised": True},
                  "kb": {"name": "Random", "privacy": "device"}, "sources": sources, "chunks": chunks,
                  "counts": {"sources": len(sources), "chunks": len(chunks)}})


def test_host_exports_in_parts_under_1_mib_and_imports_from_parts(store, tmp_path):
    # Built by importing a generated file (fast); random words, so the file does not compress away.
    import_kb(store, io.BytesIO(_synthetic(1000, dense=True)), name="Big")
    kb = store.open_kb("Big")
    counts = store.catalog.counts(kb.id)
    with HostProcess([sys.executable, "-m", "localkb", "host"], home=store.root) as host:
        host.send({"id": "x", "type": "kb.export", "data": {"kb": "Big"}})
        msgs = host.until_reply("x", timeout=120)
        reply = msgs[-1]
        assert reply["ok"], reply
        assert reply["_parts"] >= 2  # the file did not fit in one message
        assert all(len(frame) < MAX_OUTGOING for frame in host.raw)
        assert any(m.get("event") == "progress" for m in msgs)
        res = reply["result"]
        data = base64.b64decode(res["data_base64"])
        assert len(data) == res["bytes"] and hashlib.sha256(data).hexdigest() == res["sha256"]
        assert res["filename"] == "Big.awkb" and res["chunks"] == counts["chunks"]

        up = host.request({"id": 1, "type": "kb.import", "data": {"action": "begin"}})["result"]["upload"]
        step = 300 * 1024
        for n, start in enumerate(range(0, len(data), step)):
            part = base64.b64encode(data[start : start + step]).decode()
            r = host.request({"id": f"p{n}", "type": "kb.import",
                              "data": {"action": "part", "upload": up, "index": n, "data_base64": part}})
            assert r["ok"], r
        assert r["result"]["bytes"] == len(data)
        skipped = host.request({"id": 2, "type": "kb.import",
                                "data": {"action": "part", "upload": up, "index": 99, "data_base64": "AA=="}})
        assert skipped["error"]["code"] == "invalid_input"
        done = host.request({"id": 3, "type": "kb.import",
                             "data": {"action": "commit", "upload": up, "name": "Big copy"}}, timeout=120)
        assert done["ok"], done
        assert done["result"]["knowledge_base"]["name"] == "Big copy"
        assert (done["result"]["sources"], done["result"]["chunks"]) == (counts["sources"], counts["chunks"])
        # The graph the import left to compaction: the host's own thread builds it, unasked.
        listing = store.kb_dir(done["result"]["knowledge_base"]["id"]) / "vectors-hashing-256.json"
        deadline = time.monotonic() + 120
        while not json.loads(listing.read_text()).get("base_graph") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert json.loads(listing.read_text())["base_graph"] is True
        again = host.request({"id": 4, "type": "kb.import", "data": {"action": "commit", "upload": up}})
        assert again["error"]["code"] == "invalid_input"  # the upload went with its commit

        up2 = host.request({"id": 5, "type": "kb.import", "data": {"action": "begin"}})["result"]["upload"]
        head = base64.b64encode(data[:999]).decode()
        host.request({"id": 6, "type": "kb.import",
                      "data": {"action": "part", "upload": up2, "index": 0, "data_base64": head}})
        bad = host.request({"id": 7, "type": "kb.import", "data": {"action": "commit", "upload": up2}})
        assert bad["error"]["code"] == "invalid_archive" and "truncated" in bad["error"]["message"]
        up3 = host.request({"id": 8, "type": "kb.import", "data": {"action": "begin"}})["result"]["upload"]
        assert Path(store.root / "uploads" / f"{up3}.part").exists()
        assert host.request({"id": 9, "type": "kb.import",
                             "data": {"action": "abort", "upload": up3}})["result"] == {"aborted": True}
        up4 = host.request({"id": 10, "type": "kb.import", "data": {"action": "begin"}})["result"]["upload"]
        assert Path(store.root / "uploads" / f"{up4}.part").exists()
    assert not (store.root / "uploads").exists()  # dropped at host exit, their folder with the last
    new = store.open_kb("Big copy")
    assert _chunks(store, new.id) == _chunks(store, kb.id)
    assert doctor(store)["clean"]


def test_vectors_come_back_bit_identical(store, hashed):
    made = import_kb(store, io.BytesIO(_export_bytes(hashed)))
    a = [blob_vector(r[-1]) for r in _chunks(store, hashed.id)]
    b = [blob_vector(r[-1]) for r in _chunks(store, made.knowledge_base["id"])]
    assert len(a) == len(b) > 0 and all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def test_an_import_leaves_no_index_for_the_first_add_to_build(store):
    """Ingest creates its tables and a (kb_id, text_hash) index over every passage on the first
    add a catalogue sees. A catalogue that only had imports had neither, so the first add after
    importing 300,000 passages spent 1.2 s building that index (the "rare slow add" of
    bench/search.py's 300k row). The import creates them before it writes its rows."""
    schema = "SELECT type, name FROM sqlite_master WHERE type IN ('table', 'index') ORDER BY name"
    made = import_kb(store, io.BytesIO(_synthetic(300)))
    after_import = [tuple(r) for r in store.catalog.db.execute(schema)]
    assert ("index", "chunks_text_hash") in after_import
    kb = store.open_kb(made.knowledge_base["id"])
    add_document(kb, extract_text("A first note after the import.", title="Note"), key="note:1")
    assert [tuple(r) for r in store.catalog.db.execute(schema)] == after_import


def test_an_import_builds_both_indexes_at_the_catalogues_generation(store):
    made = import_kb(store, io.BytesIO(_synthetic(300)))
    kb = store.open_kb(made.knowledge_base["id"])
    vi, ki = kb.indexes()
    gen = store.catalog.generation(kb.id)
    assert (vi.generation, ki.generation) == (gen, gen) and len(vi) == ki.doc_count() == 300
    assert kb.health()["problems"] == []


def test_an_import_leaves_the_graph_to_compaction_and_answers_the_same_after_it(store):
    """Building the HNSW graph was half of an import's time: the import's first open lists the
    vectors flat (searched exactly), says compaction is due (the host starts it on its thread,
    the CLI detached), and the graph compaction builds answers as the import did."""
    told: list[str] = []
    store.on_compaction_due = told.append
    made = import_kb(store, io.BytesIO(_synthetic(300)))
    kb_id = made.knowledge_base["id"]
    assert told == [kb_id] and kb_id in store.compaction_due
    kb = store.open_kb(kb_id)
    vi, _ki = kb.indexes()
    assert not vi.base_graph and len(vi) == 300
    health = kb.health()
    assert health["problems"] == [] and health["vector_index"]["compaction_due"] == (
        "graph of 300 vectors searched exactly until then")
    searcher = Searcher(store)
    queries = ("w1 w2 w3 w4", "w4000 w17 w99", "Random 200")
    before = [_hits(searcher.search([kb_id], q, k=8)) for q in queries]
    assert all(before)
    assert kb.compact()["state"] == "compacted"
    assert kb_id not in store.compaction_due and kb.compaction_plan() is None
    assert kb.indexes()[0].base_graph
    assert [_hits(searcher.search([kb_id], q, k=8)) for q in queries] == before
    assert store.open_kb(kb_id).health()["problems"] == []


def test_a_rebuild_with_no_vectors_leaves_no_compaction_due(store):
    """An empty knowledge base's first open rebuilds an empty index, a graph already: saying
    compaction was due started a detached ``kb compact`` after ``kb create``, which raced the
    next command (caught an index up that a test had left behind on purpose)."""
    told: list[str] = []
    store.on_compaction_due = told.append
    kb = store.create_kb("Empty", model="hashing-256")
    vi, _ki = store.open_kb(kb.id).indexes()
    assert vi.base_graph and len(vi) == 0
    assert told == [] and kb.id not in store.compaction_due


def test_the_index_build_of_an_import_holds_a_part_of_its_vectors_not_all(store, monkeypatch):
    """The rebuild read every vector into one array before building (300,000 passages of
    256 dims: 307 MB of the import's 558 MiB peak); it streams them to the flat base a part
    at a time (traced Python and NumPy allocations; usearch's own are not traced)."""
    import tracemalloc

    from localkb.store import kb as kb_module

    made = import_kb(store, io.BytesIO(_synthetic(3000, dense=True)))
    kb = store.open_kb(made.knowledge_base["id"])
    gen = store.catalog.generation(kb.id)
    kb.close()
    monkeypatch.setattr(kb_module, "REBUILD_PART", 200)
    tracemalloc.start()
    try:
        vi = kb._rebuild_vectors(gen)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(vi) == 3000 and vi.generation == gen
    vectors = 3000 * 256 * 4
    assert peak < vectors / 4, f"the rebuild held {peak:,} bytes for {vectors:,} bytes of vectors"


@pytest.mark.parametrize("side", ["graph", "keywords"])
def test_an_index_build_that_fails_during_an_import_leaves_no_knowledge_base(store, monkeypatch, side):
    """The graph builds on its own thread beside the keyword index: either failing still surfaces
    as IndexUnavailable from the import, after both have stopped, and the name stays free."""
    from localkb.errors import IndexUnavailable
    from localkb.store.tantivy_index import TantivyIndex
    from localkb.store.vectors import VectorIndex

    def fail(*_args, **_kw):
        raise IndexUnavailable(f"{side} build failed (test)")

    monkeypatch.setattr(VectorIndex if side == "graph" else TantivyIndex,
                        "build_flat" if side == "graph" else "write", fail)
    before = [r.id for r in store.kbs()]
    with pytest.raises(IndexUnavailable, match=f"{side} build failed"):
        import_kb(store, io.BytesIO(_synthetic(300)), name="Broken")
    assert [r.id for r in store.kbs()] == before
    monkeypatch.undo()
    made = import_kb(store, io.BytesIO(_synthetic(300)), name="Broken")
    assert made.chunks == 300
