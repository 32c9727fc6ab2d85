"""What a knowledge base's derived indexes hold, read from their listings alone.

Each index writes a small JSON listing beside its files on every commit (the vector index
``vectors-<model>.json``, the keyword index ``<folder>.json``). Reading those costs a stat
and a parse, opens no index and imports neither engine, so the host's ``status`` and
``kb list`` can say how healthy and how fragmented every index is without loading any.
"""

from __future__ import annotations

from pathlib import Path

from localkb.atomic import read_json


def vector_file(kb_dir: Path, model: str) -> Path:
    """A knowledge base's vector index base path for ``model`` (its listing: ``.json`` beside it)."""
    return kb_dir / f"vectors-{model}.usearch"


def keyword_folder(kb_dir: Path, engine: str) -> Path:
    """The folder of a knowledge base's keyword index built with ``engine``."""
    return kb_dir / ("keywords" if engine == "whoosh" else f"keywords-{engine}")


def index_summary(kb_dir: Path, rec) -> dict:
    """``{"health": ..., "segments": {...}}`` for the knowledge base ``rec`` in ``kb_dir``.

    ``health``: ``ok``, ``missing (rebuilt on first use)`` or ``behind the catalogue (caught
    up on first use)``. ``segments``: the vector index's HNSW graph and flat (brute-force)
    segments beside its base, and the keyword index's segments — every query walks each of
    them; ``None`` where a listing does not say (missing, or written before it said).
    """
    vec = read_json(vector_file(kb_dir, rec.model).with_suffix(".json"))
    kw = read_json(keyword_folder(kb_dir, rec.keyword_engine).with_suffix(".json"))
    segs = (vec or {}).get("segments", [])
    segments = {
        # "flat": a rebuild's base (an import's), searched exactly until compaction builds its graph.
        "vector_base": None if vec is None else ("graph" if vec.get("base_graph", True) else "flat"),
        "vector_graph": None if vec is None else sum(bool(s.get("graph", True)) for s in segs),
        "vector_flat": None if vec is None else sum(not s.get("graph", True) for s in segs),
        "keyword": None if kw is None else kw.get("segments"),
    }
    if vec is None or kw is None:
        health = "missing (rebuilt on first use)"
    elif vec.get("generation") != rec.generation or kw.get("generation") != rec.generation:
        health = "behind the catalogue (caught up on first use)"
    else:
        health = "ok"
    return {"health": health, "segments": segments}


def segments_label(segments: dict | None) -> str:
    """``vec 2g+1f kw 4``: graph and flat vector segments, keyword segments (``?`` unknown);
    ``vec 0g+0f (graph due) kw 4`` while the base is a rebuild's, searched exactly."""
    if not segments:
        return ""

    def n(key: str) -> str:
        v = segments.get(key)
        return "?" if v is None else str(v)

    flat_base = " (graph due)" if segments.get("vector_base") == "flat" else ""
    return f"vec {n('vector_graph')}g+{n('vector_flat')}f{flat_base} kw {n('keyword')}"
