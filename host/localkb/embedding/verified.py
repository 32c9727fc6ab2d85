"""Model files hashed once per file identity, not at every process start.

Hashing the ~250 MB of model files (packaged int8, built fp32 and int8, weights,
tokenizer) took about 0.25 s of every cold start. A file's sha256 is recorded
here with its identity (device, inode, size, mtime and ctime in nanoseconds) and
re-computed only when any of them changes. ctime cannot be set back by a user
program (``os.utime`` sets mtime and atime, and itself moves ctime), so a file
rewritten in place under the same name, size and mtime still shows a new identity
and is hashed again.

The record lives in ``<models dir>/file-hashes.json`` once the embedder names a
folder (``use_folder``); before that, in memory only for this process.
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

from localkb.atomic import read_json, write_json
from localkb.errors import EmbeddingUnavailable

RECORD_NAME = "file-hashes.json"

_lock = threading.Lock()
_memory: dict[str, dict] = {}
#: Where the record is kept, and how many files this process really read and hashed.
_state: dict = {"record": None, "hashed": 0}


def use_folder(folder: Path) -> None:
    """Keep the record of verified identities in ``folder`` (the built-models folder)."""
    with _lock:
        _state["record"] = Path(folder) / RECORD_NAME


def hashed_count() -> int:
    """Files read and hashed by this process so far (the tests and the cold-start bench read it)."""
    return _state["hashed"]


def _identity(st: os.stat_result) -> dict:
    return {"dev": st.st_dev, "ino": st.st_ino, "size": st.st_size,
            "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns}


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks every time (``sha256_of`` reads it once)."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
    except OSError as err:
        raise EmbeddingUnavailable(f"cannot read {Path(path).name}: {err}") from err
    return digest.hexdigest()


def sha256_of(path: Path) -> str:
    """The file's sha256, from the record while its identity is unchanged, else read and recorded."""
    path = Path(path)
    try:
        key = str(path.resolve())
        ident = _identity(os.stat(key))
    except OSError as err:
        raise EmbeddingUnavailable(f"cannot read {path.name}: {err}") from err
    with _lock:
        record = _state["record"]
        known = _memory.get(key)
        if known is None and record is not None:
            saved = read_json(record)
            if isinstance(saved, dict):
                _memory.update({k: v for k, v in saved.items() if isinstance(v, dict)})
                known = _memory.get(key)
    if known is not None and known.get("identity") == ident and isinstance(known.get("sha256"), str):
        return known["sha256"]
    sha = sha256_file(Path(key))
    with _lock:
        _state["hashed"] += 1
        _memory[key] = {"identity": ident, "sha256": sha}
        if record is not None:
            try:
                saved = read_json(record)
                merged = {**(saved if isinstance(saved, dict) else {}), key: _memory[key]}
                record.parent.mkdir(parents=True, exist_ok=True)
                write_json(record, merged)
            except OSError:
                pass  # the record only saves time; the hash just computed is still right
    return sha


def forget() -> None:
    """Drop what this process remembers (the record on disk stays): a new process, for tests."""
    with _lock:
        _memory.clear()
