"""Portable knowledge bases: ``.awkb`` export and import, and the checks every file goes through.

An ``.awkb`` file is gzip of one JSON document (``version`` 1)::

    {"format": "awkb", "version": 1, "exported_at": <unix time>, "localkb": "<host version>",
     "model": {"id": "all-MiniLM-L6-v2", "dim": 384, "normalised": true},
     "kb": {"name": "Docs", "privacy": "device"},
     "sources": [{"id", "key", "type", "title", "url", "file_name", "content_hash",
                  "captured_by", "chunk_count", "pages", "lang", "added_at", "updated_at"}, ...],
     "chunks": [{"id", "source", "index", "text", "page", "tokens", "text_hash",
                 "indexed_by", "indexed_at", "vector": "<base64 of little-endian float32>"}, ...],
     "counts": {"sources": <n>, "chunks": <n>}}

Export reads one consistent snapshot of the catalogue and writes the document
item by item through gzip, so it never holds the knowledge base in memory.

Import treats the file as hostile: the compressed size is capped, the
decompressed size is capped while decompressing (a gzip bomb stops at the cap),
then the JSON and every field are checked before anything is written. The first
problem is reported in one ``InvalidArchive`` message that names it. A valid
file becomes a new knowledge base in one transaction; vectors are used as they
are (never re-embedded). If anything fails, the new knowledge base is deleted.

Encrypted files (see ``envelope``) are recognised by their magic and decrypted
to a temporary file in the data directory before the same checks run.
"""

from __future__ import annotations

import atexit
import base64
import binascii
import contextlib
import gzip
import hashlib
import json
import math
import os
import tempfile
import threading
import time
import uuid
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from localkb import __version__
from localkb.embedding.embedder import MODELS
from localkb.errors import Conflict, InvalidArchive, InvalidInput, KnowledgeBaseNotFound
from localkb.ingest.chunk import passage_text
from localkb.portable import envelope
from localkb.store.base import KnowledgeBaseHandle, KnowledgeStore
from localkb.store.kb import PRIVACY, check_name

# Export and import run on either store (``store.base``): the local one or a team one.
KnowledgeBase = KnowledgeBaseHandle
Store = KnowledgeStore

FORMAT = "awkb"
VERSION = 1
SUFFIX = ".awkb"

Progress = Callable[[dict], None]
CancelCheck = Callable[[], None]


@dataclass(frozen=True)
class Limits:
    """Caps applied to every imported file (and to host uploads)."""

    max_compressed: int = 512 * 1024 * 1024
    max_decompressed: int = 1024 * 1024 * 1024
    max_sources: int = 1_000_000
    max_chunks: int = 5_000_000
    max_text: int = 1024 * 1024  # one chunk's text, in characters
    max_field: int = 8192  # titles, URLs, keys, file names, in characters


DEFAULT_LIMITS = Limits()


def _emit(progress: Progress | None, **event: object) -> None:
    if progress is not None:
        progress(event)


def _text_hash(text: str) -> str:
    # Must equal ingest._text_hash: the re-embedder and re-adds compare these.
    return hashlib.sha256(text.encode()).hexdigest()[:32]


# == export ==========================================================================

@dataclass
class ExportReport:
    """What one export wrote."""

    kb: str
    name: str
    model: str
    sources: int
    chunks: int
    bytes: int
    sha256: str
    encrypted: bool = False
    path: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


class _Hashing:
    """A write-only file wrapper that counts and hashes what passes through it."""

    def __init__(self, raw: BinaryIO) -> None:
        self.raw = raw
        self.size = 0
        self.digest = hashlib.sha256()

    def write(self, data: bytes) -> int:
        self.raw.write(data)
        self.size += len(data)
        self.digest.update(data)
        return len(data)

    def flush(self) -> None:
        self.raw.flush()


def _dumps(obj: Any) -> bytes:
    try:
        return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
    except UnicodeEncodeError:
        # A lone surrogate cannot be UTF-8; ASCII escapes keep the document valid.
        return json.dumps(obj, ensure_ascii=True, separators=(",", ":"), allow_nan=False).encode()


def export_kb(kb: KnowledgeBase, out: BinaryIO, *, progress: Progress | None = None,
              check_cancelled: CancelCheck | None = None) -> ExportReport:
    """Write ``kb`` as an .awkb stream (gzip of one JSON document) into ``out``."""
    sink = _Hashing(out)
    with kb.snapshot() as snap:
        rec, n_sources, n_chunks = snap.record, snap.n_sources, snap.n_chunks
        # mtime=0 and no file name: the same snapshot always gives the same bytes.
        with gzip.GzipFile(fileobj=sink, mode="wb", compresslevel=6, mtime=0, filename="") as gz:
            head = {"format": FORMAT, "version": VERSION, "exported_at": time.time(),
                    "localkb": __version__,
                    "model": {"id": rec["model"], "dim": rec["dim"], "normalised": True},
                    "kb": {"name": rec["name"], "privacy": rec["privacy"]}}
            gz.write(_dumps(head)[:-1] + b',"sources":[')
            for n, s in enumerate(snap.sources):
                gz.write((b"," if n else b"") + _dumps({
                    "id": s["id"], "key": s["key"], "type": s["type"], "title": s["title"],
                    "url": s["url"], "file_name": s["file_name"], "content_hash": s["content_hash"],
                    "captured_by": s["captured_by"], "chunk_count": s["chunk_count"],
                    "pages": s["pages"], "lang": s["lang"], "added_at": s["added_at"],
                    "updated_at": s["updated_at"]}))
            gz.write(b'],"chunks":[')
            step = max(1, n_chunks // 100)
            for n, c in enumerate(snap.chunks):
                gz.write((b"," if n else b"") + _dumps({
                    "id": c["id"], "source": c["source_id"], "index": c["idx"], "text": c["text"],
                    "page": c["page"], "tokens": c["tokens"], "text_hash": c["text_hash"],
                    "indexed_by": c["indexed_by"], "indexed_at": c["indexed_at"],
                    "vector": base64.b64encode(c["vector"]).decode("ascii")}))
                if (n + 1) % step == 0:
                    if check_cancelled:
                        check_cancelled()
                    _emit(progress, stage="export", done=n + 1, total=n_chunks)
            gz.write(b'],"counts":' + _dumps({"sources": n_sources, "chunks": n_chunks}) + b"}")
    _emit(progress, stage="export", done=n_chunks, total=n_chunks)
    return ExportReport(kb=rec["id"], name=rec["name"], model=rec["model"], sources=n_sources,
                        chunks=n_chunks, bytes=sink.size, sha256=sink.digest.hexdigest())


def export_to_file(kb: KnowledgeBase, path: Path, *, passphrase: str | None = None,
                   progress: Progress | None = None,
                   check_cancelled: CancelCheck | None = None) -> ExportReport:
    """Export to ``path`` (encrypted when ``passphrase`` is given), never leaving a partial file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        if passphrase:
            with tempfile.TemporaryFile(dir=path.parent) as plain:
                report = export_kb(kb, plain, progress=progress, check_cancelled=check_cancelled)
                plain.seek(0)
                with open(tmp, "wb") as fh:
                    sink = _Hashing(fh)
                    envelope.seal(plain, sink, passphrase)
                report.bytes, report.sha256, report.encrypted = sink.size, sink.digest.hexdigest(), True
        else:
            with open(tmp, "wb") as fh:
                report = export_kb(kb, fh, progress=progress, check_cancelled=check_cancelled)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    report.path = str(path)
    return report


# == reading and validating ===========================================================

@dataclass
class Archive:
    """A fully validated .awkb document, ready to be written."""

    model: str
    dim: int
    name: str
    privacy: str
    sources: list[dict]
    chunks: list[dict]
    vectors: np.ndarray  # float32 [len(chunks), dim], row i belongs to chunks[i]
    meta: dict = field(default_factory=dict)


def is_encrypted(path: Path) -> bool:
    """Whether the file at ``path`` starts with the encrypted envelope's magic."""
    with open(path, "rb") as fh:
        return envelope.is_envelope(fh.read(len(envelope.MAGIC)))


def _gunzip_capped(src: BinaryIO, limit: int) -> bytes:
    """Decompress one gzip member, stopping as soon as the output would pass ``limit``."""
    dec = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    parts: list[bytes] = []
    total = 0
    try:
        while not dec.eof:
            block = src.read(1 << 16)
            if not block:
                break
            data = block
            while data and not dec.eof:
                out = dec.decompress(data, limit - total + 1)
                total += len(out)
                if total > limit:
                    raise InvalidArchive(f"the file decompresses to more than {limit:,} bytes "
                                         "(the decompressed-size cap)")
                parts.append(out)
                data = dec.unconsumed_tail
            if dec.eof and (dec.unused_data or src.read(1)):
                raise InvalidArchive("the file has data after the end of its gzip stream")
    except zlib.error as err:
        raise InvalidArchive(f"the file is not valid gzip: {err}") from err
    if not dec.eof:
        raise InvalidArchive("the file is truncated: the gzip stream ends early")
    return b"".join(parts)


def _reject_constant(name: str) -> Any:
    raise InvalidArchive(f"the JSON contains {name}, which is not a number")


def _parse(raw: bytes) -> dict:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InvalidArchive(f"the document is not valid UTF-8 (byte {err.start:,})") from err
    try:
        doc = json.loads(text, parse_constant=_reject_constant)
    except InvalidArchive:
        raise
    except RecursionError as err:
        raise InvalidArchive("the JSON is nested too deeply") from err
    except ValueError as err:  # JSONDecodeError, and integers past Python's digit limit
        raise InvalidArchive(f"the document is not valid JSON: {err}") from err
    if not isinstance(doc, dict):
        raise InvalidArchive(f"the document must be a JSON object, not {type(doc).__name__}")
    return doc


def _n(i: int) -> str:
    return f"{i:,}"


class _Checker:
    """Field checks that raise ``InvalidArchive`` naming the item and the field."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits

    def obj(self, where: str, value: Any) -> dict:
        if not isinstance(value, dict):
            raise InvalidArchive(f"{where}: must be an object")
        return value

    def get(self, where: str, obj: dict, key: str) -> Any:
        if key not in obj:
            raise InvalidArchive(f"{where}: '{key}' is missing")
        return obj[key]

    def string(self, where: str, obj: dict, key: str, *, max_len: int | None = None,
               optional: bool = False, empty: bool = False) -> str | None:
        value = obj.get(key) if optional else self.get(where, obj, key)
        if value is None and optional:
            return None
        if not isinstance(value, str):
            raise InvalidArchive(f"{where}: '{key}' must be a string")
        cap = max_len or self.limits.max_field
        if len(value) > cap:
            raise InvalidArchive(f"{where}: '{key}' is {len(value):,} characters, the cap is {cap:,}")
        if not empty and not value:
            raise InvalidArchive(f"{where}: '{key}' is empty")
        return value

    def integer(self, where: str, obj: dict, key: str, *, lo: int, hi: int,
                optional: bool = False) -> int | None:
        value = obj.get(key) if optional else self.get(where, obj, key)
        if value is None and optional:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise InvalidArchive(f"{where}: '{key}' must be an integer from {lo:,} to {hi:,}")
        return value

    def number(self, where: str, obj: dict, key: str) -> float:
        value = self.get(where, obj, key)
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
                or abs(value) > 1e12:
            raise InvalidArchive(f"{where}: '{key}' must be a finite number")
        return float(value)


def _vector(where: str, value: Any, dim: int) -> np.ndarray:
    if not isinstance(value, str):
        raise InvalidArchive(f"{where}: vector must be a base64 string")
    if len(value) > (dim * 4 + 2) // 3 * 4:
        raise InvalidArchive(f"{where}: vector has more than {dim} dimensions, this model has {dim}")
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as err:
        raise InvalidArchive(f"{where}: vector is not valid base64") from err
    if len(raw) != dim * 4:
        if len(raw) % 4:
            raise InvalidArchive(f"{where}: vector is {len(raw):,} bytes, not a whole number of "
                                 "float32 values")
        raise InvalidArchive(f"{where}: vector has {len(raw) // 4:,} dimensions, this model has {dim}")
    vec = np.frombuffer(raw, dtype="<f4")
    if not np.isfinite(vec).all():
        raise InvalidArchive(f"{where}: vector has a value that is not finite")
    norm = float(np.sqrt(np.dot(vec.astype(np.float64), vec.astype(np.float64))))
    if norm < 1e-6:
        raise InvalidArchive(f"{where}: vector is zero")
    if abs(norm - 1.0) > 1e-2:
        raise InvalidArchive(f"{where}: vector is not normalised (norm {norm:.4g})")
    return vec


def validate_document(doc: dict, *, limits: Limits = DEFAULT_LIMITS,
                      check_cancelled: CancelCheck | None = None) -> Archive:
    """Check every field of a parsed .awkb document; raise ``InvalidArchive`` at the first problem."""
    ck = _Checker(limits)
    fmt = doc.get("format")
    if fmt != FORMAT:
        raise InvalidArchive(f"not an .awkb file: 'format' is {fmt!r}, expected {FORMAT!r}")
    version = doc.get("version")
    if isinstance(version, bool) or not isinstance(version, int):
        raise InvalidArchive("'version' must be an integer")
    if version != VERSION:
        raise InvalidArchive(f".awkb version {version} is not supported (this host reads version "
                             f"{VERSION})")
    model = ck.obj("model", ck.get("document", doc, "model"))
    model_id = ck.string("model", model, "id", max_len=200)
    if model_id not in MODELS:
        raise InvalidArchive(f"model {model_id!r} is not known to this host (known: "
                             f"{', '.join(sorted(MODELS))}); nothing was imported")
    dim = MODELS[model_id].dim
    if ck.integer("model", model, "dim", lo=1, hi=65536) != dim:
        raise InvalidArchive(f"model: 'dim' is {model['dim']}, but {model_id} has {dim} dimensions")
    if model.get("normalised") is not True:
        raise InvalidArchive("model: 'normalised' must be true")
    kbinfo = ck.obj("kb", ck.get("document", doc, "kb"))
    name = ck.string("kb", kbinfo, "name", max_len=80)
    try:
        name = check_name(name)
    except InvalidInput as err:
        raise InvalidArchive(f"kb: 'name': {err}") from err
    privacy = ck.string("kb", kbinfo, "privacy", max_len=20)
    if privacy not in PRIVACY:
        raise InvalidArchive(f"kb: 'privacy' must be 'device' or 'cloud', not {privacy!r}")
    sources_in = ck.get("document", doc, "sources")
    chunks_in = ck.get("document", doc, "chunks")
    if not isinstance(sources_in, list):
        raise InvalidArchive("'sources' must be a list")
    if not isinstance(chunks_in, list):
        raise InvalidArchive("'chunks' must be a list")
    if len(sources_in) > limits.max_sources:
        raise InvalidArchive(f"{len(sources_in):,} sources, the cap is {limits.max_sources:,}")
    if len(chunks_in) > limits.max_chunks:
        raise InvalidArchive(f"{len(chunks_in):,} chunks, the cap is {limits.max_chunks:,}")
    counts = ck.obj("counts", ck.get("document", doc, "counts"))
    for key, items in (("sources", sources_in), ("chunks", chunks_in)):
        stated = ck.integer("counts", counts, key, lo=0, hi=10**12)
        if stated != len(items):
            raise InvalidArchive(f"counts: says {stated:,} {key}, the file holds {len(items):,}")

    sources: list[dict] = []
    by_id: dict[str, dict] = {}
    keys: set[str] = set()
    for i, raw in enumerate(sources_in):
        where = f"source {_n(i)}"
        s = ck.obj(where, raw)
        out = {"id": ck.string(where, s, "id", max_len=64),
               "key": ck.string(where, s, "key"),
               "type": ck.string(where, s, "type", max_len=32),
               "title": ck.string(where, s, "title", empty=True),
               "url": ck.string(where, s, "url", optional=True),
               "file_name": ck.string(where, s, "file_name", optional=True),
               "content_hash": ck.string(where, s, "content_hash", max_len=128),
               "captured_by": ck.string(where, s, "captured_by", max_len=40),
               "chunk_count": ck.integer(where, s, "chunk_count", lo=0, hi=limits.max_chunks),
               "pages": ck.integer(where, s, "pages", lo=0, hi=10**7, optional=True),
               "lang": ck.string(where, s, "lang", max_len=35, optional=True),
               "added_at": ck.number(where, s, "added_at"),
               "updated_at": ck.number(where, s, "updated_at")}
        if out["id"] in by_id:
            raise InvalidArchive(f"{where}: id {out['id']!r} appears twice")
        if out["key"] in keys:
            raise InvalidArchive(f"{where}: key {out['key']!r} appears twice")
        by_id[out["id"]] = out
        keys.add(out["key"])
        out["_stored"] = 0
        sources.append(out)

    chunks: list[dict] = []
    vectors = np.empty((len(chunks_in), dim), dtype=np.float32)
    seen_ids: set[str] = set()
    seen_pos: set[tuple[str, int]] = set()
    for i, raw in enumerate(chunks_in):
        where = f"chunk {_n(i)}"
        if check_cancelled and i % 1000 == 0:
            check_cancelled()
        c = ck.obj(where, raw)
        out = {"id": ck.string(where, c, "id", max_len=64),
               "source": ck.string(where, c, "source", max_len=64),
               "index": ck.integer(where, c, "index", lo=0, hi=limits.max_chunks),
               "text": ck.string(where, c, "text", max_len=limits.max_text),
               "page": ck.integer(where, c, "page", lo=0, hi=10**7, optional=True),
               "tokens": ck.integer(where, c, "tokens", lo=0, hi=10**7),
               "text_hash": ck.string(where, c, "text_hash", max_len=64),
               "indexed_by": ck.string(where, c, "indexed_by", max_len=40),
               "indexed_at": ck.number(where, c, "indexed_at")}
        if out["id"] in seen_ids:
            raise InvalidArchive(f"{where}: id {out['id']!r} appears twice")
        src = by_id.get(out["source"])
        if src is None:
            raise InvalidArchive(f"{where}: source {out['source']!r} is not in the file's sources")
        if out["index"] >= src["chunk_count"]:
            raise InvalidArchive(f"{where}: index {out['index']:,} is past its source's "
                                 f"{src['chunk_count']:,} chunks")
        if (out["source"], out["index"]) in seen_pos:
            raise InvalidArchive(f"{where}: its source already has a chunk {out['index']:,}")
        if _text_hash(passage_text(src["title"], out["text"])) != out["text_hash"]:
            raise InvalidArchive(f"{where}: text_hash does not match its text")
        vectors[i] = _vector(where, c.get("vector"), dim)
        seen_ids.add(out["id"])
        seen_pos.add((out["source"], out["index"]))
        src["_stored"] += 1
        chunks.append(out)
    for s in sources:
        del s["_stored"]
    meta = {k: doc[k] for k in ("exported_at", "localkb") if k in doc}
    return Archive(model=model_id, dim=dim, name=name, privacy=privacy, sources=sources,
                   chunks=chunks, vectors=vectors, meta=meta)


def _size(fh: BinaryIO) -> int:
    fh.seek(0, os.SEEK_END)
    size = fh.tell()
    fh.seek(0)
    return size


def read_archive(src: BinaryIO, *, passphrase: str | None = None, limits: Limits = DEFAULT_LIMITS,
                 tmp_dir: Path | None = None, check_cancelled: CancelCheck | None = None) -> Archive:
    """Read, decrypt if needed, decompress under the caps, parse and validate an .awkb stream.

    ``src`` must be seekable. Raises ``InvalidArchive``, ``PassphraseRequired`` or
    ``DecryptionFailed``; returns only a fully checked ``Archive``.
    """
    size = _size(src)
    if size == 0:
        raise InvalidArchive("the file is empty")
    if envelope.is_envelope(src.read(len(envelope.MAGIC))):
        src.seek(0)
        if size > limits.max_compressed + envelope.HEADER_SIZE + envelope.TAG_SIZE:
            raise InvalidArchive(f"the file is {size:,} bytes, the cap is {limits.max_compressed:,}")
        with tempfile.TemporaryFile(dir=tmp_dir) as plain:
            envelope.open_envelope(src, plain, passphrase, size=size)
            plain.seek(0)
            return read_archive(plain, limits=limits, check_cancelled=check_cancelled)
    src.seek(0)
    if size > limits.max_compressed:
        raise InvalidArchive(f"the file is {size:,} bytes, the cap is {limits.max_compressed:,}")
    if src.read(2) != b"\x1f\x8b":
        raise InvalidArchive("not an .awkb file: it is neither gzip nor an encrypted LocalKB file")
    src.seek(0)
    doc = _parse(_gunzip_capped(src, limits.max_decompressed))
    return validate_document(doc, limits=limits, check_cancelled=check_cancelled)


# == import ===========================================================================

@dataclass
class ImportReport:
    """What an import created, counted from the rows in the catalogue."""

    knowledge_base: dict
    sources: int
    chunks: int
    model: str
    name_in_file: str

    def to_dict(self) -> dict:
        return asdict(self)


def _taken(store: Store, name: str) -> bool:
    try:
        store.resolve(name)
    except KnowledgeBaseNotFound:
        return False
    return True


def free_name(store: Store, wanted: str) -> str:
    """``wanted`` if no knowledge base has it, else ``wanted (2)``, ``wanted (3)``, ..."""
    if not _taken(store, wanted):
        return wanted
    n = 2
    while True:
        suffix = f" ({n})"
        candidate = wanted[: 80 - len(suffix)] + suffix
        if not _taken(store, candidate):
            return candidate
        n += 1


def write_archive(store: Store, archive: Archive, *, name: str | None = None,
                  progress: Progress | None = None) -> ImportReport:
    """Create a new knowledge base holding ``archive``: all of it, or no trace at all."""
    # The local store's write lock keeps the name free until the knowledge base exists; the
    # team store's unique name index does the same inside its own transaction.
    with store.lock.hold() if hasattr(store, "lock") else contextlib.nullcontext():
        if name is not None:
            name = check_name(name)
            if _taken(store, name):
                raise Conflict(f"a knowledge base named {name!r} already exists")
        else:
            name = free_name(store, archive.name)
        rec = store.create_kb(name, privacy=archive.privacy, model=archive.model)
        try:
            kb = store.open_kb(rec.id)
            _emit(progress, stage="write", done=0, total=len(archive.chunks))
            kb.import_rows(archive.sources, archive.chunks, archive.vectors)
            counts = store.counts(rec.id)
            if counts != {"sources": len(archive.sources), "chunks": len(archive.chunks)}:
                raise InvalidArchive(f"the import stored {counts['sources']:,} sources and "
                                     f"{counts['chunks']:,} chunks, the file holds "
                                     f"{len(archive.sources):,} and {len(archive.chunks):,}")
            kb.legs()  # the local store builds its derived indexes here
        except BaseException:
            store.delete_kb(rec.id)
            raise
        _emit(progress, stage="write", done=len(archive.chunks), total=len(archive.chunks))
        rec = store.resolve(rec.id)
        return ImportReport(knowledge_base=rec.public(), sources=counts["sources"],
                            chunks=counts["chunks"], model=rec.model, name_in_file=archive.name)


def import_kb(store: Store, src: Path | BinaryIO, *, name: str | None = None,
              passphrase: str | None = None, limits: Limits = DEFAULT_LIMITS,
              progress: Progress | None = None,
              check_cancelled: CancelCheck | None = None) -> ImportReport:
    """Validate an .awkb file (path or seekable binary file) whole, then import it as a new KB."""
    _emit(progress, stage="validate", done=0, total=1)
    if isinstance(src, str | os.PathLike):
        try:
            fh = open(src, "rb")  # noqa: SIM115 - closed in the finally below
        except OSError as err:
            raise InvalidInput(f"cannot read {src}: {err.strerror}") from err
    else:
        fh = src
    try:
        archive = read_archive(fh, passphrase=passphrase, limits=limits, tmp_dir=getattr(store, "root", None),
                               check_cancelled=check_cancelled)
    finally:
        if fh is not src:
            fh.close()
    _emit(progress, stage="validate", done=1, total=1)
    if check_cancelled:
        check_cancelled()
    return write_archive(store, archive, name=name, progress=progress)


# == host uploads ======================================================================

class Uploads:
    """Files arriving in parts over native messaging, held in temporary files in the data dir.

    Each upload is capped at ``max_bytes``; parts must come in order (index 0, 1, ...).
    An upload is dropped on commit, on abort, when the process exits, and (for a
    host that was killed) when a later host starts one and finds it a day old.
    """

    STALE_SECONDS = 24 * 3600

    def __init__(self, root: Path, *, max_bytes: int = DEFAULT_LIMITS.max_compressed) -> None:
        self.dir = Path(root) / "uploads"
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._open: dict[str, dict] = {}
        atexit.register(self.drop_all)

    def begin(self) -> str:
        self.dir.mkdir(parents=True, exist_ok=True)
        self._sweep()
        upload = "up_" + uuid.uuid4().hex[:16]
        path = self.dir / f"{upload}.part"
        path.touch(mode=0o600)
        with self._lock:
            self._open[upload] = {"path": path, "next": 0, "bytes": 0}
        return upload

    def _get(self, upload: object) -> dict:
        if not isinstance(upload, str) or upload not in self._open:
            raise InvalidInput(f"no upload {upload!r} in progress (begin one first)",
                               detail={"field": "upload"})
        return self._open[upload]

    def part(self, upload: str, index: int, data: bytes) -> dict:
        """Append part ``index``; returns the bytes received so far."""
        with self._lock:
            up = self._get(upload)
            if index != up["next"]:
                raise InvalidInput(f"upload {upload}: expected part {up['next']}, got {index}",
                                   detail={"field": "index"})
            if up["bytes"] + len(data) > self.max_bytes:
                self._drop(upload)
                raise InvalidArchive(f"the upload passed the {self.max_bytes:,}-byte cap; it was dropped")
            with open(up["path"], "ab") as fh:
                fh.write(data)
            up["next"] += 1
            up["bytes"] += len(data)
            return {"upload": upload, "parts": up["next"], "bytes": up["bytes"]}

    def take(self, upload: str) -> Path:
        """Hand the finished file to the caller, who must ``drop`` it when done."""
        with self._lock:
            return self._get(upload)["path"]

    def drop(self, upload: str) -> bool:
        with self._lock:
            return self._drop(upload)

    def _drop(self, upload: str) -> bool:
        up = self._open.pop(upload, None)
        if up is None:
            return False
        up["path"].unlink(missing_ok=True)
        return True

    def drop_all(self) -> None:
        with self._lock:
            for upload in list(self._open):
                self._drop(upload)

    def _sweep(self) -> None:
        cutoff = time.time() - self.STALE_SECONDS
        for path in self.dir.glob("up_*.part"):
            try:
                if path.stat().st_mtime < cutoff:
                    path.unlink()
            except OSError:
                continue

