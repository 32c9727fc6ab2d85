"""Embedders: the ONNX all-MiniLM-L6-v2 model and a weightless feature-hashing model.

Both return L2-normalised float32 matrices and never anything partial: any
failure (a missing or altered model file, an onnxruntime error, a NaN, a zero
or wrong-length vector) raises ``EmbeddingUnavailable``.
"""

from __future__ import annotations

import itertools
import re
import threading
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from localkb.embedding.files import (
    MAX_TOKENS,
    PACKAGED_MODEL_SHA256,
    check_sha256,
    load_tokenizer,
    packaged_model_path,
)
from localkb.errors import EmbeddingUnavailable, InvalidInput
from localkb.locks import FileLock

MINILM_ID = "all-MiniLM-L6-v2"
HASHING_ID = "hashing-256"

#: Padded tokens per model batch (see ``MiniLMEmbedder._batches``).
TOKEN_BUDGET = 2048


def session_options(threads: int):
    """onnxruntime options of every MiniLM session (the embedder's and the variant timing's).

    Spinning is off: an ingest runs the model beside its reader thread (extraction,
    chunking) and the host, on machines with few cores shared with everything else. A
    spinning pool thread waiting at a barrier for a peer the OS has descheduled burns a
    core for nothing; on the shared 2-core machine spinning cost the bare model and the
    ingest a third more CPU time for the same passages (RESULTS.md, "An ingest is a job of two threads").
    """
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return opts

ProgressFn = Callable[[int, int], None]


def validate(vectors: np.ndarray, n: int, dim: int, model_id: str) -> np.ndarray:
    """Check shape, finiteness and norm; raise rather than hand back a bad row."""
    if vectors.shape != (n, dim):
        raise EmbeddingUnavailable(
            f"{model_id} returned vectors of shape {vectors.shape}, expected ({n}, {dim})"
        )
    if not np.isfinite(vectors).all():
        bad = int(np.flatnonzero(~np.isfinite(vectors).all(axis=1))[0])
        raise EmbeddingUnavailable(f"{model_id} returned a non-finite vector (text {bad})")
    norms = np.linalg.norm(vectors, axis=1)
    if n and float(norms.min()) < 1e-6:
        bad = int(np.argmin(norms))
        raise EmbeddingUnavailable(f"{model_id} returned a zero vector (text {bad})")
    return (vectors / norms[:, None]).astype(np.float32, copy=False)


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 through onnxruntime: mean pooling over the attention mask, 384-d."""

    model_id = MINILM_ID
    dim = 384
    max_tokens = MAX_TOKENS

    def __init__(
        self,
        model_path: Path | None = None,
        expected_sha256: str | None = PACKAGED_MODEL_SHA256,
        *,
        variant: str = "packaged-int8",
        threads: int = 0,
        batch_size: int = 32,
    ) -> None:
        self.model_path = model_path
        self.expected_sha256 = expected_sha256
        self.variant = variant
        self.threads = threads
        self.batch_size = batch_size
        self._session = None
        self._tokenizer = None
        self._counter = None
        self._lock = threading.Lock()
        #: Why this variant was chosen (speeds measured, a forced choice, or a fallback reason).
        self.selection: dict = {}

    # -- loading ---------------------------------------------------------------
    @property
    def tokenizer(self):
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self.max_tokens)
        return self._tokenizer

    @property
    def loaded(self) -> bool:
        return self._session is not None

    def load(self) -> None:
        """Check the files' sha256 and start the onnxruntime session (once)."""
        with self._lock:
            if self._session is not None:
                return
            path = self.model_path or packaged_model_path()
            if self.expected_sha256:
                check_sha256(path, self.expected_sha256, f"the embedding model ({self.variant})")
            _ = self.tokenizer
            try:
                import onnxruntime as ort

                session = ort.InferenceSession(
                    str(path), sess_options=session_options(self.threads), providers=["CPUExecutionProvider"]
                )
            except Exception as err:
                raise EmbeddingUnavailable(
                    f"onnxruntime could not load the embedding model {path.name}: {err}"
                ) from err
            self._input_names = {i.name for i in session.get_inputs()}
            self._session = session

    # -- tokens ----------------------------------------------------------------
    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """Tokens of each text without [CLS]/[SEP] and without truncation (for chunking)."""
        if self._counter is None:
            from tokenizers import Tokenizer

            counter = Tokenizer.from_str(self.tokenizer.to_str())
            counter.no_truncation()
            self._counter = counter
        return [len(e.ids) for e in self._counter.encode_batch(list(texts), add_special_tokens=False)]

    # -- embedding -------------------------------------------------------------
    def embed(self, texts: Sequence[str], progress: ProgressFn | None = None,
              work: dict | None = None) -> np.ndarray:
        """Embed ``texts`` in length-sorted batches; rows come back in input order.

        ``work``, if given, is added this call's model work: ``batches`` run, ``texts``,
        ``tokens`` and ``padded_tokens`` (batch rows x the longest row: what the model really
        computes). The ingest reports it per job; ``bench/ingest.py`` prints the padding.
        """
        n = len(texts)
        if n == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        self.load()
        try:
            encodings = self.tokenizer.encode_batch(list(texts))
        except Exception as err:
            raise EmbeddingUnavailable(f"tokenizing failed: {err}") from err
        order = sorted(range(n), key=lambda i: len(encodings[i].ids))
        out = np.empty((n, self.dim), dtype=np.float32)
        done = 0
        for idx in self._batches(order, [len(e.ids) for e in encodings]):
            batch = [encodings[i].ids for i in idx]
            out[idx] = self._run(batch)
            _count(batch, work)
            done += len(idx)
            if progress:
                progress(done, n)
        return validate(out, n, self.dim, self.model_id)

    def _batches(self, order: list[int], lengths: list[int]) -> list[list[int]]:
        """Length-sorted batches of at most ``batch_size`` texts and ``TOKEN_BUDGET`` padded tokens.

        Attention memory grows with batch x length^2: 32 passages of 256 tokens
        peaked at about 1 GB here, 8 of them at 380 MB, and ran no slower.
        """
        batches: list[list[int]] = []
        cur: list[int] = []
        for i in order:
            if cur and (len(cur) == self.batch_size or lengths[i] * (len(cur) + 1) > TOKEN_BUDGET):
                batches.append(cur)
                cur = []
            cur.append(i)
        if cur:
            batches.append(cur)
        return batches

    def _run(self, batch_ids: list[list[int]]) -> np.ndarray:
        width = max(len(ids) for ids in batch_ids)
        input_ids = np.zeros((len(batch_ids), width), dtype=np.int64)
        mask = np.zeros_like(input_ids)
        for row, ids in enumerate(batch_ids):
            input_ids[row, : len(ids)] = ids
            mask[row, : len(ids)] = 1
        feeds = {"input_ids": input_ids, "attention_mask": mask}
        if "token_type_ids" in self._input_names:
            feeds["token_type_ids"] = np.zeros_like(input_ids)
        try:
            hidden = self._session.run(None, feeds)[0]
        except Exception as err:
            raise EmbeddingUnavailable(f"onnxruntime failed while embedding: {err}") from err
        m = mask[:, :, None].astype(np.float32)
        return (hidden * m).sum(axis=1) / np.clip(m.sum(axis=1), 1e-9, None)

    def describe(self) -> dict:
        return {"id": self.model_id, "dim": self.dim, "variant": self.variant, "loaded": self.loaded,
                "selection": self.selection}


def _count(batch_ids: list[list[int]], work: dict | None) -> None:
    """Add one model batch to ``work``: its rows, tokens, and padded tokens (rows x the longest)."""
    if work is None:
        return
    step = {"batches": 1, "texts": len(batch_ids), "tokens": sum(len(ids) for ids in batch_ids),
            "padded_tokens": max(len(ids) for ids in batch_ids) * len(batch_ids)}
    for k, v in step.items():
        work[k] = work.get(k, 0) + v


_WORD = re.compile(r"\w+", re.UNICODE)


class HashingEmbedder:
    """Word and character n-grams hashed into 256 signed buckets: no weights, deterministic.

    A light second model: it proves routing and re-embedding across dimensions,
    and as an eval canary it measures what lexical overlap alone can do.
    """

    model_id = HASHING_ID
    dim = 256
    max_tokens = MAX_TOKENS
    variant = "hashing"
    loaded = True

    def load(self) -> None:
        return None

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        return [len(_WORD.findall(t)) for t in texts]

    def _vector(self, text: str) -> np.ndarray:
        vec = np.zeros(self.dim, dtype=np.float64)
        words = [w.lower() for w in _WORD.findall(text)][: self.max_tokens]
        feats: list[str] = [f"w:{w}" for w in words]
        feats += [f"b:{a} {b}" for a, b in itertools.pairwise(words)]
        for w in words:
            padded = f"<{w}>"
            feats += [f"c:{padded[i : i + 3]}" for i in range(len(padded) - 2)]
        for feat in feats:
            h = zlib.crc32(feat.encode("utf-8"))
            vec[h % self.dim] += 1.0 if (h >> 16) & 1 else -1.0
        return np.sign(vec) * np.sqrt(np.abs(vec))

    def embed(self, texts: Sequence[str], progress: ProgressFn | None = None,
              work: dict | None = None) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            out[i] = self._vector(text)
        if progress:
            progress(len(texts), len(texts))
        return validate(out, len(texts), self.dim, self.model_id)

    def describe(self) -> dict:
        return {"id": self.model_id, "dim": self.dim, "variant": self.variant, "loaded": True}


Embedder = MiniLMEmbedder | HashingEmbedder


@dataclass(frozen=True)
class ModelSpec:
    """One entry of the model registry."""

    id: str
    dim: int
    description: str


MODELS: dict[str, ModelSpec] = {
    MINILM_ID: ModelSpec(MINILM_ID, 384, "all-MiniLM-L6-v2 (ONNX), mean pooled, 256 tokens"),
    HASHING_ID: ModelSpec(HASHING_ID, 256, "feature hashing of words and character trigrams"),
}


_SHARED: dict[tuple, Embedder] = {}
_SHARED_LOCK = threading.Lock()


class EmbedderRegistry:
    """Hands out one embedder per model and settings for the whole process (the model loads once)."""

    def __init__(self, settings) -> None:
        self.settings = settings

    def spec(self, model_id: str) -> ModelSpec:
        try:
            return MODELS[model_id]
        except KeyError:
            known = ", ".join(sorted(MODELS))
            raise InvalidInput(f"unknown model {model_id!r} (known: {known})") from None

    def ready(self, model_id: str) -> bool:
        """Whether this process already holds the model (``get`` returns at once)."""
        key = (model_id, self.settings.model_variant, self.settings.threads,
               self.settings.embed_batch_size)
        with _SHARED_LOCK:
            return key in _SHARED

    def get(self, model_id: str) -> Embedder:
        self.spec(model_id)
        key = (model_id, self.settings.model_variant, self.settings.threads,
               self.settings.embed_batch_size)
        with _SHARED_LOCK:
            if key not in _SHARED:
                _SHARED[key] = self._create(model_id)
            return _SHARED[key]

    def _create(self, model_id: str) -> Embedder:
        if model_id == HASHING_ID:
            return HashingEmbedder()
        return select_minilm(self.settings)


VARIANTS = ("packaged-int8", "built-int8", "built-fp32")


def select_minilm(settings, *, force_build: bool = False) -> MiniLMEmbedder:
    """The fastest verified MiniLM variant on this machine, or the one ``LOCALKB_MODEL_VARIANT`` forces.

    The first call builds our own fp32 and per-channel int8 models from the shipped
    weights (``modelbuild``), verifies them against the packaged model and times
    the candidates; both results are cached beside the built files. If the build
    cannot run, the packaged int8 model is used and the reason is kept.
    """
    forced = settings.model_variant
    if forced is not None and forced not in VARIANTS:
        raise InvalidInput(f"LOCALKB_MODEL_VARIANT must be one of {', '.join(VARIANTS)}")
    common = {"threads": settings.threads, "batch_size": settings.embed_batch_size}
    if forced == "packaged-int8":
        emb = MiniLMEmbedder(**common)
        emb.selection = {"forced": True}
        return emb
    from localkb.embedding import build as modelbuild
    from localkb.embedding import verified

    built_dir = settings.models_root / "minilm-built"
    try:
        built_dir.mkdir(parents=True, exist_ok=True)
        verified.use_folder(built_dir)
        # Two hosts starting at once must not build into the same folder together.
        with FileLock(built_dir / ".build.lock").hold():
            info = modelbuild.build(built_dir, force=force_build)
        paths = modelbuild.variant_paths(built_dir)
        if forced:
            choice, speeds = forced, {}
        else:
            candidates = {name: paths[name] for name in ("packaged-int8", "built-int8")}
            speeds = modelbuild.measure_variants(candidates, modelbuild.VERIFY_TEXTS,
                                                 out_dir=built_dir, threads=settings.threads or 2)
            choice = max(speeds, key=speeds.get)
        if choice == "packaged-int8":
            emb = MiniLMEmbedder(**common)
        else:
            name = paths[choice].name
            emb = MiniLMEmbedder(paths[choice], info["outputs"][name]["sha256"], variant=choice, **common)
        emb.selection = {"forced": bool(forced),
                         "tokens_per_s": {k: round(v) for k, v in speeds.items()},
                         "rounds": modelbuild.TIMING_ROUNDS if speeds else 0,
                         "verification": info.get("verification", {})}
        return emb
    except (EmbeddingUnavailable, OSError) as err:
        if forced:
            raise EmbeddingUnavailable(f"the forced model variant {forced} is unavailable: {err}") from err
        emb = MiniLMEmbedder(**common)
        emb.selection = {"fallback": f"the built model could not be used: {err}"}
        return emb
