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

Import treats the file as hostile and never builds the document: the compressed size is
capped, the decompressed size is capped while decompressing (a gzip bomb stops at the cap),
and a streaming parser (ijson) feeds a state machine that accepts only the shape above, with
its keys in the writer's order (``sources`` after ``format``, ``version``, ``model`` and
``kb``; ``chunks`` after ``sources``). An unknown key, an object or a list where a value
belongs, a field given twice, a lone surrogate or a NUL is refused at the event that shows
it, so memory holds one item at a time (a parse bomb costs what a small import costs; see
``bench/import_memory.py``). Each checked row goes to a private staging database in
``<data dir>/imports``; the new knowledge base appears in the one catalogue transaction that
copies all of its rows in, so a refused file, a cancel or a kill -9 leaves no trace and the
name free (a killed import's staging files are swept when the store next opens, or the team
server next starts). The
first problem is reported in one ``InvalidArchive`` message that names it; vectors are used
as they are (never re-embedded).

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
import re
import shutil
import sqlite3
import tempfile
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import ijson
import numpy as np

from localkb import __version__
from localkb.embedding.embedder import MODELS
from localkb.errors import (
    Conflict,
    HostBusy,
    InvalidArchive,
    InvalidInput,
    KnowledgeBaseNotFound,
    LimitExceeded,
)
from localkb.ingest.chunk import passage_text
from localkb.perms import create_private_file
from localkb.portable import envelope
from localkb.staging import import_staging
from localkb.store.base import KnowledgeBaseHandle, KnowledgeStore
from localkb.store.catalog import chunk_id, source_id, vector_key
from localkb.store.kb import PRIVACY, check_name
from localkb.store.kb import Store as LocalStore
from localkb.strings import string_problem

if TYPE_CHECKING:
    from localkb.team.store import TeamStore

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


# == reading: checked while it is parsed ================================================
# The document is never built. ijson (yajl) turns the decompressed stream into events, and a
# small state machine takes them in the one shape a valid archive has: an object of known
# keys, each source and chunk an object of known scalar fields. Anything else (an unknown
# key, an object or a list where a value belongs, a field twice) is refused at the event
# that shows it, so memory holds one item at a time, whatever the file expands to.

_TOP = ("format", "version", "exported_at", "localkb", "model", "kb", "sources", "chunks", "counts")
# Field -> what it must be ("s" string, "i" integer, "n" number, "b" boolean), for the message
# that refuses an object or a list in its place.
_MODEL_FIELDS = {"id": "s", "dim": "i", "normalised": "b"}
_KB_FIELDS = {"name": "s", "privacy": "s"}
_COUNT_FIELDS = {"sources": "i", "chunks": "i"}
_SOURCE_FIELDS = {"id": "s", "key": "s", "type": "s", "title": "s", "url": "s", "file_name": "s",
                  "content_hash": "s", "captured_by": "s", "chunk_count": "i", "pages": "i",
                  "lang": "s", "added_at": "n", "updated_at": "n"}
_CHUNK_FIELDS = {"id": "s", "source": "s", "index": "i", "text": "s", "page": "i", "tokens": "i",
                 "text_hash": "s", "indexed_by": "s", "indexed_at": "n", "vector": "s"}
_KINDS = {"s": "a string", "i": "an integer", "n": "a finite number", "b": "true or false"}
# A UTF-16 surrogate escape in the JSON text: a pair is one character (written by tools that
# escape everything non-ASCII); a lone one is not text, and the catalogue could not store it.
_SURROGATE_ESCAPE = re.compile(
    rb"(?P<pair>\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2})"
    rb"|\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def is_encrypted(path: Path) -> bool:
    """Whether the file at ``path`` starts with the encrypted envelope's magic."""
    with open(path, "rb") as fh:
        return envelope.is_envelope(fh.read(len(envelope.MAGIC)))


class _Inflate:
    """The decompressed text of one gzip member, as a file: capped, truncation and trailing data
    refused, and a lone surrogate escape refused before the parser can mangle it."""

    def __init__(self, src: BinaryIO, limit: int) -> None:
        self._src = src
        self._dec = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
        self._limit = limit
        self._total = 0
        self._out = b""
        self._done = False
        self._carry = b""  # the end of the last block: an escape may straddle two blocks

    def read(self, size: int = -1) -> bytes:
        size = 1 << 16 if size is None or size < 0 else size
        while not self._out and not self._done:
            self._fill(size)
        out, self._out = self._out[:size], self._out[size:]
        return out

    def _fill(self, size: int) -> None:
        if self._dec.eof:
            if self._dec.unused_data or self._src.read(1):
                raise InvalidArchive("the file has data after the end of its gzip stream")
            self._done = True
            return
        data = self._dec.unconsumed_tail or self._src.read(1 << 16)
        if not data:
            raise InvalidArchive("the file is truncated: the gzip stream ends early")
        try:
            out = self._dec.decompress(data, max(size, 1 << 16))
        except zlib.error as err:
            raise InvalidArchive(f"the file is not valid gzip: {err}") from err
        self._total += len(out)
        if self._total > self._limit:
            raise InvalidArchive(f"the file decompresses to more than {self._limit:,} bytes "
                                 "(the decompressed-size cap)")
        if b"\\u" in out or self._carry.endswith(b"\\") or b"\\u" in self._carry:
            self._check_escapes(self._carry + out, len(self._carry))
        self._carry = out[-11:]
        self._out = out

    @staticmethod
    def _check_escapes(text: bytes, start: int) -> None:
        for m in _SURROGATE_ESCAPE.finditer(text):
            if m.group("pair") is None and m.end() > start:
                # (An even run of backslashes before it makes it literal text; no archive holds
                # such a run, and refusing it is the safe side of that corner.)
                raise InvalidArchive(f"the file holds a lone UTF-16 surrogate "
                                     f"({m.group(0).decode('ascii')}), which is not text")


class _Events:
    """The parser's events, with every way it can fail turned into ``InvalidArchive``."""

    def __init__(self, text: _Inflate) -> None:
        self._it = ijson.basic_parse(text, use_float=True, buf_size=1 << 16)

    def next(self) -> tuple[str, Any]:
        try:
            return next(self._it)
        except StopIteration:
            raise InvalidArchive("the document ends early") from None
        except ijson.JSONError as err:
            raise InvalidArchive(f"the document is not valid JSON: {_first_line(err)}") from err
        except UnicodeDecodeError as err:
            raise InvalidArchive("the document is not valid UTF-8 text") from err

    def end(self) -> None:
        try:
            next(self._it)
        except StopIteration:
            return
        except ijson.JSONError as err:
            raise InvalidArchive(f"the document is not valid JSON: {_first_line(err)}") from err
        raise InvalidArchive("the document has more after its end")

    def scalar(self, where: str, key: str, kind: str) -> Any:
        event, value = self.next()
        if event in ("start_map", "start_array"):
            raise InvalidArchive(f"{where}: '{key}' must be {_KINDS[kind]}")
        return value

    def obj(self, where: str, noun: str, fields: dict[str, str], *, started: bool = False) -> dict:
        """One object of scalar fields; refused at an unknown, repeated or nested field."""
        if not started:
            event, _ = self.next()
            if event != "start_map":
                raise InvalidArchive(f"{where}: must be an object")
        out: dict[str, Any] = {}
        while True:
            event, key = self.next()
            if event == "end_map":
                return out
            if key not in fields:
                raise InvalidArchive(f"{where}: {key[:40]!r} is not a field of {noun}")
            if key in out:
                raise InvalidArchive(f"{where}: '{key}' appears twice")
            out[key] = self.scalar(where, key, fields[key])

    def items(self, what: str) -> Iterator[int]:
        """Walk a list of objects: yields each index with the object's start consumed."""
        event, _ = self.next()
        if event != "start_array":
            raise InvalidArchive(f"'{what}' must be a list")
        i = 0
        while True:
            event, _ = self.next()
            if event == "end_array":
                return
            if event != "start_map":
                raise InvalidArchive(f"{what[:-1]} {_n(i)}: must be an object")
            yield i
            i += 1


def _first_line(err: Exception) -> str:
    text = str(err.args[0] if err.args else err)
    if text.startswith(("b'", 'b"')):
        text = text[2:-1]
    return text.replace("\\n", "\n").strip().splitlines()[0][:200] if text.strip() else "malformed"


def _n(i: int) -> str:
    return f"{i:,}"


class _Checker:
    """Field checks that raise ``InvalidArchive`` naming the item and the field."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits

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
        problem = string_problem(value)
        if problem:
            raise InvalidArchive(f"{where}: '{key}' {problem}")
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


def _vector(where: str, value: Any, dim: int) -> bytes:
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
    return raw


@dataclass
class _Head:
    """What the document says before its sources: checked, and ready to be written."""

    model: str
    dim: int
    name: str
    privacy: str


def _check_head(ck: _Checker, seen: dict[str, Any]) -> _Head:
    fmt = seen.get("format")
    if fmt != FORMAT:
        raise InvalidArchive(f"not an .awkb file: 'format' is {fmt!r}, expected {FORMAT!r}")
    version = seen.get("version")
    if isinstance(version, bool) or not isinstance(version, int):
        raise InvalidArchive("'version' must be an integer")
    if version != VERSION:
        raise InvalidArchive(f".awkb version {version} is not supported (this host reads version "
                             f"{VERSION})")
    model = ck.get("document", seen, "model")
    model_id = ck.string("model", model, "id", max_len=200)
    if model_id not in MODELS:
        raise InvalidArchive(f"model {model_id!r} is not known to this host (known: "
                             f"{', '.join(sorted(MODELS))}); nothing was imported")
    dim = MODELS[model_id].dim
    if ck.integer("model", model, "dim", lo=1, hi=65536) != dim:
        raise InvalidArchive(f"model: 'dim' is {model['dim']}, but {model_id} has {dim} dimensions")
    if model.get("normalised") is not True:
        raise InvalidArchive("model: 'normalised' must be true")
    kbinfo = ck.get("document", seen, "kb")
    name = ck.string("kb", kbinfo, "name", max_len=80)
    try:
        name = check_name(name)
    except InvalidInput as err:
        raise InvalidArchive(f"kb: 'name': {err}") from err
    privacy = ck.string("kb", kbinfo, "privacy", max_len=20)
    if privacy not in PRIVACY:
        raise InvalidArchive(f"kb: 'privacy' must be 'device' or 'cloud', not {privacy!r}")
    return _Head(model_id, dim, name, privacy)


_STAGING_SCHEMA = """
CREATE TABLE sources (aid TEXT PRIMARY KEY, sid TEXT NOT NULL, key TEXT NOT NULL UNIQUE,
    type TEXT, title TEXT, url TEXT, file_name TEXT, content_hash TEXT, captured_by TEXT,
    chunk_count INTEGER, pages INTEGER, lang TEXT, added_at REAL, updated_at REAL);
CREATE TABLE chunks (aid TEXT NOT NULL UNIQUE, id TEXT PRIMARY KEY, vkey INTEGER NOT NULL,
    source_id TEXT NOT NULL, idx INTEGER NOT NULL, text TEXT, text_hash TEXT, page INTEGER,
    tokens INTEGER, vector BLOB, indexed_by TEXT, indexed_at REAL, UNIQUE (source_id, idx));
"""


class _Stager:
    """Checks a document event by event and writes its rows into a private staging database.

    Row ids are the ones the new knowledge base will have, so publishing is one
    ``INSERT ... SELECT`` per table; uniqueness (ids, keys, positions) is the staging
    database's constraints, so nothing but the current item is held in memory.
    """

    def __init__(self, path: Path, kb_id: str, limits: Limits, progress: Progress | None,
                 check_cancelled: CancelCheck | None) -> None:
        self.kb_id = kb_id
        self.ck = _Checker(limits)
        self.limits = limits
        self.progress = progress
        self.check_cancelled = check_cancelled
        self.db = sqlite3.connect(path, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=OFF")  # a crash just means the file is swept
        self.db.execute("PRAGMA synchronous=OFF")
        self.db.executescript(_STAGING_SCHEMA)
        self.db.execute("BEGIN")
        self.sources = 0
        self.chunks = 0
        self._source: tuple[str, str, str, int] | None = None  # (aid, sid, title, chunk_count)

    def close(self) -> None:
        if self.db.in_transaction:
            self.db.execute("COMMIT")
        self.db.close()

    def read(self, events: _Events) -> _Head:
        event, _ = events.next()
        if event != "start_map":
            kind = {"start_array": "list", "string": "str", "number": "number",
                    "boolean": "bool", "null": "NoneType"}.get(event, event)
            raise InvalidArchive(f"the document must be a JSON object, not {kind}")
        seen: dict[str, Any] = {}
        head: _Head | None = None
        while True:
            event, key = events.next()
            if event == "end_map":
                break
            if key not in _TOP:
                raise InvalidArchive(f"{key[:40]!r} is not a field of an .awkb document")
            if key in seen:
                raise InvalidArchive(f"'{key}' appears twice")
            if key == "sources":
                head = _check_head(self.ck, seen)
                seen[key] = True
                self._read_sources(events)
            elif key == "chunks":
                if "sources" not in seen:
                    raise InvalidArchive("'sources' is missing (it comes before 'chunks')")
                seen[key] = True
                assert head is not None
                self._read_chunks(events, head.dim)
            elif key in ("model", "kb", "counts"):
                fields = {"model": _MODEL_FIELDS, "kb": _KB_FIELDS, "counts": _COUNT_FIELDS}[key]
                seen[key] = events.obj(key, f"'{key}'", fields)
            else:
                seen[key] = events.scalar("document", key, "i" if key == "version" else "s")
        events.end()
        if head is None:
            head = _check_head(self.ck, seen)
        for key in ("sources", "chunks"):
            if key not in seen:
                raise InvalidArchive(f"document: '{key}' is missing")
        counts = self.ck.get("document", seen, "counts")
        for key, n in (("sources", self.sources), ("chunks", self.chunks)):
            stated = self.ck.integer("counts", counts, key, lo=0, hi=10**12)
            if stated != n:
                raise InvalidArchive(f"counts: says {stated:,} {key}, the file holds {n:,}")
        return head

    def _read_sources(self, events: _Events) -> None:
        ck = self.ck
        for i in events.items("sources"):
            where = f"source {_n(i)}"
            if i >= self.limits.max_sources:
                raise InvalidArchive(f"more than {self.limits.max_sources:,} sources, the cap")
            s = events.obj(where, "a source", _SOURCE_FIELDS, started=True)
            key = ck.string(where, s, "key")
            row = (ck.string(where, s, "id", max_len=64), source_id(self.kb_id, key), key,
                   ck.string(where, s, "type", max_len=32), ck.string(where, s, "title", empty=True),
                   ck.string(where, s, "url", optional=True),
                   ck.string(where, s, "file_name", optional=True),
                   ck.string(where, s, "content_hash", max_len=128),
                   ck.string(where, s, "captured_by", max_len=40),
                   ck.integer(where, s, "chunk_count", lo=0, hi=self.limits.max_chunks),
                   ck.integer(where, s, "pages", lo=0, hi=10**7, optional=True),
                   ck.string(where, s, "lang", max_len=35, optional=True),
                   ck.number(where, s, "added_at"), ck.number(where, s, "updated_at"))
            try:
                self.db.execute("INSERT INTO sources VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)", row)
            except sqlite3.IntegrityError as err:
                what = ("key", row[2]) if "sources.key" in str(err) else ("id", row[0])
                raise InvalidArchive(f"{where}: {what[0]} {what[1]!r} appears twice") from err
            self.sources += 1

    def _lookup(self, aid: str) -> tuple[str, str, str, int] | None:
        if self._source is None or self._source[0] != aid:
            row = self.db.execute("SELECT aid, sid, title, chunk_count FROM sources WHERE aid = ?",
                                  (aid,)).fetchone()
            self._source = tuple(row) if row else None
        return self._source

    def _read_chunks(self, events: _Events, dim: int) -> None:
        ck = self.ck
        for i in events.items("chunks"):
            where = f"chunk {_n(i)}"
            if i >= self.limits.max_chunks:
                raise InvalidArchive(f"more than {self.limits.max_chunks:,} chunks, the cap")
            if i % 1000 == 0:
                if self.check_cancelled:
                    self.check_cancelled()
                _emit(self.progress, stage="validate", done=i, total=None)
            c = events.obj(where, "a chunk", _CHUNK_FIELDS, started=True)
            aid = ck.string(where, c, "id", max_len=64)
            source = ck.string(where, c, "source", max_len=64)
            index = ck.integer(where, c, "index", lo=0, hi=self.limits.max_chunks)
            text = ck.string(where, c, "text", max_len=self.limits.max_text)
            page = ck.integer(where, c, "page", lo=0, hi=10**7, optional=True)
            tokens = ck.integer(where, c, "tokens", lo=0, hi=10**7)
            text_hash = ck.string(where, c, "text_hash", max_len=64)
            indexed_by = ck.string(where, c, "indexed_by", max_len=40)
            indexed_at = ck.number(where, c, "indexed_at")
            src = self._lookup(source)
            if src is None:
                raise InvalidArchive(f"{where}: source {source!r} is not in the file's sources")
            _, sid, title, chunk_count = src
            if index >= chunk_count:
                raise InvalidArchive(f"{where}: index {index:,} is past its source's "
                                     f"{chunk_count:,} chunks")
            if _text_hash(passage_text(title, text)) != text_hash:
                raise InvalidArchive(f"{where}: text_hash does not match its text")
            vector = _vector(where, c.get("vector"), dim)
            cid = chunk_id(self.kb_id, sid, index)
            try:
                self.db.execute("INSERT INTO chunks VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                                (aid, cid, vector_key(cid), sid, index, text, text_hash, page,
                                 tokens, vector, indexed_by, indexed_at))
            except sqlite3.IntegrityError as err:
                if "chunks.aid" in str(err):
                    raise InvalidArchive(f"{where}: id {aid!r} appears twice") from err
                raise InvalidArchive(f"{where}: its source already has a chunk {index:,}") from err
            self.chunks += 1


def _size(fh: BinaryIO) -> int:
    fh.seek(0, os.SEEK_END)
    size = fh.tell()
    fh.seek(0)
    return size


def _stage(src: BinaryIO, stager: _Stager, *, passphrase: str | None, limits: Limits,
           tmp_dir: Path | None) -> _Head:
    """Decrypt if needed, decompress under the caps, check and stage; the first problem raises."""
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
            return _stage(plain, stager, passphrase=None, limits=limits, tmp_dir=tmp_dir)
    src.seek(0)
    if size > limits.max_compressed:
        raise InvalidArchive(f"the file is {size:,} bytes, the cap is {limits.max_compressed:,}")
    if src.read(2) != b"\x1f\x8b":
        raise InvalidArchive("not an .awkb file: it is neither gzip nor an encrypted LocalKB file")
    src.seek(0)
    return stager.read(_Events(_Inflate(src, limits.max_decompressed)))


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


def _publish(store: LocalStore, staged: Path, head: _Head, stager: _Stager, name: str | None) -> dict:
    """Make the staged knowledge base visible: its row, sources and chunks in one transaction."""
    kb_id = stager.kb_id
    spec = store.models.spec(head.model)
    db = store.catalog.db
    with store.lock.hold():
        db.execute("ATTACH DATABASE ? AS staged", (str(staged),))
        try:
            with store.catalog.tx() as tx:
                if name is not None:
                    if store.catalog.kb_by_name(name) is not None:
                        raise Conflict(f"a knowledge base named {name!r} already exists")
                else:
                    name = free_name(store, head.name)
                # Generation 1 with no derived index yet: the first open builds both from here.
                tx.execute("INSERT INTO kbs (id, name, privacy, model, dim, created, generation) "
                           "VALUES (?,?,?,?,?,?,1)",
                           (kb_id, name, head.privacy, spec.id, spec.dim, time.time()))
                tx.execute(
                    "INSERT INTO sources (id, kb_id, key, type, title, url, file_name, content_hash, "
                    "captured_by, chunk_count, pages, lang, added_at, updated_at) "
                    "SELECT sid, ?, key, type, title, url, file_name, content_hash, captured_by, "
                    "chunk_count, pages, lang, added_at, updated_at FROM staged.sources", (kb_id,))
                tx.execute(
                    "INSERT INTO chunks (id, vkey, kb_id, source_id, idx, text, text_hash, page, "
                    "tokens, vector, indexed_by, indexed_at) SELECT id, vkey, ?, source_id, idx, "
                    "text, text_hash, page, tokens, vector, indexed_by, indexed_at "
                    "FROM staged.chunks", (kb_id,))
                counts = {"sources": tx.execute("SELECT COUNT(*) FROM sources WHERE kb_id = ?",
                                                (kb_id,)).fetchone()[0],
                          "chunks": tx.execute("SELECT COUNT(*) FROM chunks WHERE kb_id = ?",
                                               (kb_id,)).fetchone()[0]}
                if counts != {"sources": stager.sources, "chunks": stager.chunks}:
                    raise InvalidArchive(f"the import stored {counts['sources']:,} sources and "
                                         f"{counts['chunks']:,} chunks, the file holds "
                                         f"{stager.sources:,} and {stager.chunks:,}")
        finally:
            db.execute("DETACH DATABASE staged")
    return counts


def _publish_team(store: TeamStore, staged: Path, head: _Head, name: str | None) -> tuple[str, dict]:
    """The team store: the new knowledge base and all its rows in one PostgreSQL transaction
    (``create_imported``), so a kill leaves it whole or absent."""
    if name is not None:
        if _taken(store, name):
            raise Conflict(f"a knowledge base named {name!r} already exists")
    else:
        name = free_name(store, head.name)
    db = sqlite3.connect(staged)
    db.row_factory = sqlite3.Row
    try:
        sources = [{**dict(r), "id": r["sid"]} for r in db.execute("SELECT * FROM sources")]
        chunks, vecs = [], []
        for r in db.execute("SELECT * FROM chunks ORDER BY source_id, idx"):
            chunks.append({"source": r["source_id"], "index": r["idx"], "text": r["text"],
                           "text_hash": r["text_hash"], "page": r["page"], "tokens": r["tokens"],
                           "indexed_by": r["indexed_by"]})
            vecs.append(np.frombuffer(r["vector"], dtype="<f4"))
    finally:
        db.close()
    vectors = np.stack(vecs) if vecs else np.zeros((0, head.dim), np.float32)
    rec = store.create_imported(name, privacy=head.privacy, model=head.model, sources=sources,
                                chunks=chunks, vectors=vectors)
    counts = store.counts(rec.id)
    if counts != {"sources": len(sources), "chunks": len(chunks)}:
        store.delete_kb(rec.id)
        raise InvalidArchive(f"the import stored {counts['sources']:,} sources and "
                             f"{counts['chunks']:,} chunks, the file holds "
                             f"{len(sources):,} and {len(chunks):,}")
    return rec.id, counts


def import_kb(store: Store, src: Path | BinaryIO, *, name: str | None = None,
              passphrase: str | None = None, limits: Limits = DEFAULT_LIMITS,
              progress: Progress | None = None,
              check_cancelled: CancelCheck | None = None) -> ImportReport:
    """Import an .awkb file (path or seekable binary file) as a new knowledge base, or refuse it.

    The file is checked as it is read and its rows go to a private staging database
    (``<data dir>/imports``); the knowledge base appears in the one catalogue transaction
    that writes all of its rows, and only then are its derived indexes built. A refused file,
    a cancel or a kill leaves no trace in the catalogue (a killed import's staging files are
    swept the next time the store is opened or the team server started), and the name stays free.
    """
    if name is not None:
        name = check_name(name)
    _emit(progress, stage="validate", done=0, total=None)
    if isinstance(src, str | os.PathLike):
        try:
            fh = open(src, "rb")  # noqa: SIM115 - closed in the finally below
        except OSError as err:
            raise InvalidInput(f"cannot read {src}: {err.strerror}") from err
    else:
        fh = src
    kb_id = "kb_" + uuid.uuid4().hex[:12]
    try:
        # A private staging folder in the data directory (the team server's for a team store).
        root = Path(store.settings.data_dir)
        with import_staging(root).job(kb_id) as job:
            staged = job.with_suffix(".sqlite")
            stager = _Stager(staged, kb_id, limits, progress, check_cancelled)
            try:
                head = _stage(fh, stager, passphrase=passphrase, limits=limits, tmp_dir=root)
            finally:
                stager.close()
            if check_cancelled:
                check_cancelled()
            _emit(progress, stage="write", done=0, total=stager.chunks)
            if isinstance(store, LocalStore):
                # Ingest's tables and its (kb_id, text_hash) index, before the rows: built
                # later, by the first add, they cost that add a pass over every passage.
                from localkb.store.ingest_staging import ensure_tables

                ensure_tables(store)
                counts = _publish(store, staged, head, stager, name)
            else:
                kb_id, counts = _publish_team(store, staged, head, name)
    finally:
        if fh is not src:
            fh.close()
    try:
        store.open_kb(kb_id).legs()  # the local store builds its derived indexes here
    except BaseException:
        store.delete_kb(kb_id)
        raise
    _emit(progress, stage="write", done=counts["chunks"], total=counts["chunks"])
    rec = store.resolve(kb_id)
    return ImportReport(knowledge_base=rec.public(), sources=counts["sources"],
                        chunks=counts["chunks"], model=rec.model, name_in_file=head.name)


# == host uploads ======================================================================

class Uploads:
    """Files arriving in parts over native messaging, held in temporary files in the data dir.

    Bounded three ways: at most ``max_open`` uploads at once (``host_busy`` past that), each at
    most ``max_bytes``, and all of them together at most ``max_total`` bytes on disk, never
    leaving less than ``min_free`` bytes free (``limit_exceeded``). Parts must come in order
    (index 0, 1, ...). An upload is dropped on commit, on abort, when the process exits, when
    it has had no part for ``idle_seconds`` (its slot is freed for others), and (for a host that
    was killed) when a later host starts one and finds it a day old. The folder goes with the
    last upload, so a refused or aborted one leaves nothing in the data directory.
    """

    STALE_SECONDS = 24 * 3600

    def __init__(self, root: Path, *, max_bytes: int = DEFAULT_LIMITS.max_compressed,
                 max_open: int = 4, max_total: int = 1024 * 1024 * 1024,
                 min_free: int = 512 * 1024 * 1024, idle_seconds: float = 900.0) -> None:
        self.dir = Path(root) / "uploads"
        self.max_bytes = max_bytes
        self.max_open = max_open
        self.max_total = max_total
        self.min_free = min_free
        self.idle_seconds = idle_seconds
        self._lock = threading.Lock()
        self._open: dict[str, dict] = {}
        atexit.register(self.drop_all)

    def begin(self) -> str:
        if self.dir.is_dir():
            self._sweep()
        with self._lock:
            self._expire()
            if len(self._open) >= self.max_open:
                raise HostBusy(f"{len(self._open)} uploads are open, the most this host takes at "
                               "once; commit or abort one first",
                               detail={"limit": "uploads", "max": self.max_open})
            upload = "up_" + uuid.uuid4().hex[:16]
            path = self.dir / f"{upload}.part"
            os.close(create_private_file(path))
            self._open[upload] = {"path": path, "next": 0, "bytes": 0, "seen": time.monotonic()}
        return upload

    def _expire(self) -> None:
        now = time.monotonic()
        for upload in [u for u, up in self._open.items() if now - up["seen"] > self.idle_seconds]:
            self._drop(upload)

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
            total = sum(u["bytes"] for u in self._open.values())
            if total + len(data) > self.max_total:
                raise LimitExceeded(
                    f"the open uploads would hold more than {self.max_total:,} bytes on disk; "
                    "commit or abort one, then send this part again",
                    detail={"limit": "upload_bytes", "max": self.max_total})
            free = shutil.disk_usage(self.dir).free
            if free - len(data) < self.min_free:
                raise LimitExceeded(
                    f"only {free:,} bytes are free on the disk of the data directory; this part "
                    f"would leave less than {self.min_free:,}",
                    detail={"limit": "disk_free", "min": self.min_free})
            with open(up["path"], "ab") as fh:
                fh.write(data)
            up["next"] += 1
            up["bytes"] += len(data)
            up["seen"] = time.monotonic()
            return {"upload": upload, "parts": up["next"], "bytes": up["bytes"]}

    def take(self, upload: str) -> Path:
        """Hand the finished file to the caller, who must ``drop`` it when done."""
        with self._lock:
            up = self._get(upload)
            up["seen"] = time.monotonic()
            return up["path"]

    def drop(self, upload: str) -> bool:
        with self._lock:
            return self._drop(upload)

    def _drop(self, upload: str) -> bool:
        up = self._open.pop(upload, None)
        if up is None:
            return False
        up["path"].unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # not empty: another upload is open
            self.dir.rmdir()
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
