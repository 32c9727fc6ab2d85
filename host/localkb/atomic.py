"""Write files so a crash never leaves a half-written one in place."""

from __future__ import annotations

import json
import os
from pathlib import Path


def tmp_path_for(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def replace_into(tmp: Path, path: Path) -> None:
    """fsync the finished temporary file, then rename it over ``path``."""
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def write_json(path: Path, data: dict, mode: int | None = None) -> None:
    tmp = tmp_path_for(path)
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=2, sort_keys=True)
    if mode is not None:
        os.chmod(tmp, mode)
    replace_into(tmp, path)


def read_json(path: Path) -> dict | None:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
