"""Files on disk as ingest sees them: what a folder holds, what is skipped and why, fingerprints.

Every file a folder walk meets is accounted for: a candidate to add, or skipped with a
reason a person can act on (``unsupported type: image/png``, ``too large: ...``,
``empty``). Files and folders matched by an exclude rule (and hidden ones) are counted,
not listed: a ``.git`` folder holds thousands of them.

A fingerprint is (size, mtime in ns, sha256 of the bytes). Ingest compares size and mtime
first (a stat, no read), then the hash (a read, no extraction), before it extracts anything.
"""

from __future__ import annotations

import fnmatch
import hashlib
import mimetypes
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from localkb.ingest.documents import readable

DEFAULT_EXCLUDES = (".*", "node_modules", "__pycache__", "*.pyc", ".git")


@dataclass(frozen=True)
class Fingerprint:
    size: int
    mtime_ns: int
    sha256: str | None = None  # None until the bytes were read


def stat_fingerprint(path: Path) -> Fingerprint:
    st = path.stat()
    return Fingerprint(st.st_size, st.st_mtime_ns)


def hash_file(path: Path) -> str:
    """Hex sha256 of the file's bytes, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def human_bytes(n: int) -> str:
    for unit in ("bytes", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:,} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


def parse_size(text: str) -> int:
    """``50MB``, ``2GB``, ``700k``, ``0`` (no cap) -> bytes (decimal units, as ``human_bytes`` prints)."""
    s = text.strip().lower().replace(" ", "").removesuffix("b").removesuffix("i")
    mult = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
    factor = 1
    if s and s[-1] in mult:
        factor, s = mult[s[-1]], s[:-1]
    try:
        value = float(s)
    except ValueError:
        raise ValueError(f"not a size: {text!r} (e.g. 200MB, 2GB, or 0 for no cap)") from None
    if value < 0:
        raise ValueError(f"not a size: {text!r}")
    return int(value * factor)


def unsupported_reason(path: Path) -> str:
    guessed, _ = mimetypes.guess_type(path.name)
    what = guessed or (f"{path.suffix.lower()} file" if path.suffix else "file without an extension")
    return f"unsupported type: {what}"


def too_large_reason(size: int, cap: int) -> str:
    return f"too large: {human_bytes(size)}, over the {human_bytes(cap)} cap (--max-size to lift it)"


@dataclass
class FolderWalk:
    """One folder's files: candidates in order, the skipped with reasons, the excluded counted."""

    root: Path
    files: list[tuple[Path, int]] = field(default_factory=list)  # (path, size)
    skipped: list[tuple[Path, str]] = field(default_factory=list)
    excluded: int = 0


def _matches(path: Path, root: Path, patterns: Iterable[str]) -> bool:
    rel = path.relative_to(root).as_posix() if path != root else path.name
    return any(fnmatch.fnmatch(path.name, p) or fnmatch.fnmatch(rel, p) for p in patterns)


def walk_folder(root: Path, include: Iterable[str] = (), exclude: Iterable[str] = (), *,
                max_bytes: int = 0) -> FolderWalk:
    """Files under ``root`` (sorted), honouring include/exclude globs; hidden folders skipped.

    With ``include`` globs, only files matching one are candidates (the rest are excluded,
    not skipped); without, files of a type LocalKB cannot read are skipped with the reason.
    ``max_bytes`` > 0 skips bigger files as too large; empty files are skipped as empty.
    """
    include, exclude = list(include), list(exclude) + list(DEFAULT_EXCLUDES)
    walk = FolderWalk(root)
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        kept = sorted(d for d in dirnames if not _matches(here / d, root, exclude))
        walk.excluded += len(dirnames) - len(kept)
        dirnames[:] = kept
        for name in sorted(filenames):
            path = here / name
            if _matches(path, root, exclude) or (include and not _matches(path, root, include)):
                walk.excluded += 1
                continue
            if not include and not readable(path.name):
                walk.skipped.append((path, unsupported_reason(path)))
                continue
            try:
                size = path.stat().st_size
            except OSError as err:
                walk.skipped.append((path, f"cannot read the file: {err.strerror}"))
                continue
            if size == 0:
                walk.skipped.append((path, "empty"))
            elif max_bytes and size > max_bytes:
                walk.skipped.append((path, too_large_reason(size, max_bytes)))
            else:
                walk.files.append((path, size))
    return walk
