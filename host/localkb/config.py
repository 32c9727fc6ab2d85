"""Settings in one frozen dataclass: defaults in one place, the environment read once."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

DEFAULT_MODEL = "all-MiniLM-L6-v2"


def default_data_dir() -> Path:
    """The per-user data directory (``LOCALKB_HOME`` overrides)."""
    import platformdirs

    return Path(platformdirs.user_data_dir("localkb", appauthor=False))


@dataclass(frozen=True)
class Settings:
    """Everything tunable, passed down explicitly; nothing reads the environment later."""

    data_dir: Path
    #: Where the built ONNX models live (``LOCALKB_MODEL_DIR``; default ``<data_dir>/models``).
    model_dir: Path | None = None
    default_model: str = DEFAULT_MODEL
    #: Force one embedder variant (``packaged-int8``, ``built-int8``, ``built-fp32``).
    model_variant: str | None = None
    #: Threads for onnxruntime; 0 lets it pick (all cores).
    threads: int = 0
    embed_batch_size: int = 32
    #: Passage size in model tokens, title line included. The model reads up to 256, but it
    #: was trained on pairs of at most 128 and matches short passages better (SciFact
    #: vector nDCG@10: 256 -> 0.654, 128 -> 0.676, 96 -> 0.692; RESULTS.md "Passage size").
    max_chunk_tokens: int = 96
    chunk_overlap_tokens: int = 16
    #: Relevance floor on cosine similarity; hits below it are "weaker matches".
    cutoff: float = 0.35
    rrf_k: int = 60
    #: Below this many vectors a knowledge base is searched exactly.
    exact_search_below: int = 5000
    fetch_url_max_bytes: int = 20 * 1024 * 1024
    #: Size cap of one source (a file, a capture); 0 lifts it (``--max-size``, ``LOCALKB_MAX_SOURCE``).
    max_source_bytes: int = 200 * 1000 * 1000
    #: Model tokens per ingest write batch; a source with more passages than this is staged
    #: in batches of this size and switched in at the end (``LOCALKB_INGEST_BATCH_TOKENS``).
    ingest_batch_tokens: int = 65_536
    fetch_timeout_s: float = 20.0
    #: Keyword engine of new knowledge bases: auto | whoosh | tantivy (``LOCALKB_KEYWORD_ENGINE``).
    keyword_engine: str = "auto"
    #: Whether chat turns are written to the query log.
    query_log: bool = True
    #: How long a model's write waits for the user's Approve before it counts as declined.
    confirm_timeout_s: float = 600.0
    #: When vector compaction runs after a write leaves it due (``LOCALKB_COMPACT``):
    #: background (the host's thread; a detached ``localkb kb compact --auto`` after a CLI
    #: command), inline (before the command returns) or off (only ``localkb kb compact``).
    compact: str = "background"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: object) -> Settings:
        """Build settings from defaults and ``LOCALKB_*`` environment variables."""
        env = os.environ if env is None else env
        home = env.get("LOCALKB_HOME")
        settings = cls(data_dir=Path(home).expanduser() if home else default_data_dir())
        changes: dict[str, object] = {}
        if env.get("LOCALKB_MODEL_DIR"):
            changes["model_dir"] = Path(env["LOCALKB_MODEL_DIR"]).expanduser()
        if env.get("LOCALKB_MODEL_VARIANT"):
            changes["model_variant"] = env["LOCALKB_MODEL_VARIANT"]
        if env.get("LOCALKB_THREADS"):
            changes["threads"] = int(env["LOCALKB_THREADS"])
        if env.get("LOCALKB_MAX_SOURCE"):
            from localkb.ingest.files import parse_size

            changes["max_source_bytes"] = parse_size(env["LOCALKB_MAX_SOURCE"])
        if env.get("LOCALKB_INGEST_BATCH_TOKENS"):
            changes["ingest_batch_tokens"] = int(env["LOCALKB_INGEST_BATCH_TOKENS"])
        if env.get("LOCALKB_CUTOFF"):
            changes["cutoff"] = float(env["LOCALKB_CUTOFF"])
        if env.get("LOCALKB_CONFIRM_TIMEOUT_S"):
            changes["confirm_timeout_s"] = float(env["LOCALKB_CONFIRM_TIMEOUT_S"])
        if env.get("LOCALKB_KEYWORD_ENGINE"):
            changes["keyword_engine"] = env["LOCALKB_KEYWORD_ENGINE"]
        if env.get("LOCALKB_COMPACT"):
            if env["LOCALKB_COMPACT"] not in {"background", "inline", "off"}:
                raise ValueError("LOCALKB_COMPACT must be background, inline or off")
            changes["compact"] = env["LOCALKB_COMPACT"]
        if env.get("LOCALKB_QUERY_LOG") in {"0", "off", "false"}:
            changes["query_log"] = False
        changes.update(overrides)
        return replace(settings, **changes)

    @property
    def models_root(self) -> Path:
        return self.model_dir or self.data_dir / "models"
