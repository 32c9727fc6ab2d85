"""Embedding speed and fidelity of every MiniLM variant, side by side, on the same texts.

    python bench/embed.py [--texts 400] [--threads 2] [--out DIR]

Texts: the first N SciFact abstracts from ../shared/datasets/beir-scifact/corpus.jsonl
(relative to the repository root), or generated text when that file is absent.
Variants: packaged-int8, built-fp32, built-int8 (built into a temporary folder unless
--out is given), and sentence-transformers fp32 on torch when it is importable.
Every variant is timed once per round, the order rotating from round to round (A/B/C,
B/C/A, ...), and the table prints min/median/max tokens/s of each and of its ratio to the
reference (sentence-transformers when installed, else packaged-int8) round by round, and
the cosine with built-fp32.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
ST = "sentence-transformers-fp32"
sys.path.insert(0, str(REPO / "bench"))
from _common import SCIFACT as _SCIFACT_DIR  # noqa: E402
from _common import rotated, spread  # noqa: E402

SCIFACT = _SCIFACT_DIR / "corpus.jsonl"

sys.path.insert(0, str(REPO / "host"))
from localkb.embedding import build as mb  # noqa: E402


def load_texts(n: int) -> tuple[list[str], str]:
    """First ``n`` SciFact abstracts, or deterministic generated text when absent."""
    if SCIFACT.is_file():
        texts = []
        with open(SCIFACT, encoding="utf-8") as fh:
            for line in fh:
                texts.append(json.loads(line)["text"])
                if len(texts) == n:
                    break
        return texts, f"SciFact abstracts ({SCIFACT.name})"
    rng = random.Random(8)
    words = ["cell", "protein", "model", "data", "river", "study", "patient", "effect",
             "signal", "network", "method", "result", "growth", "energy", "memory", "city",
             "water", "light", "sample", "theory", "trial"]
    texts = [" ".join(rng.choice(words) for _ in range(rng.randint(8, 220))) + "."
             for _ in range(n)]
    return texts, "generated text (SciFact not found)"


def sentence_transformers_model(threads: int):
    """A sentence-transformers fp32 model on torch, or None if not installed."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import torch
        from sentence_transformers import SentenceTransformer
    except ImportError:
        return None
    torch.set_num_threads(threads)
    model = SentenceTransformer(str(mb.weights_dir()), device="cpu")
    model.max_seq_length = mb.MAX_TOKENS
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--texts", type=int, default=400)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None,
                        help="folder for the built models (default: a temporary one)")
    args = parser.parse_args()

    texts, source = load_texts(args.texts)
    tok = mb.load_tokenizer()
    tokens = sum(len(e.ids) for e in tok.encode_batch(texts))

    with tempfile.TemporaryDirectory(prefix="localkb-bench-") as tmp:
        out = args.out or Path(tmp) / "minilm-built"
        t0 = time.perf_counter()
        info = mb.build(out)
        build_s = time.perf_counter() - t0
        sessions = {name: mb.open_session(path, args.threads) for name, path in mb.variant_paths(out).items()}
        runners = {name: (lambda ts, s=s: mb.embed_with(s, tok, ts)) for name, s in sessions.items()}
        st = sentence_transformers_model(args.threads)
        if st is not None:
            runners[ST] = lambda ts: np.asarray(st.encode(ts, batch_size=32, normalize_embeddings=True,
                                                          convert_to_numpy=True), dtype=np.float32)
        names = list(runners)
        vecs = {name: run(texts[:32]) for name, run in runners.items()}  # warm-up
        speeds: dict[str, list[float]] = {name: [] for name in names}
        for r in range(args.rounds):
            for name in rotated(names, r):
                t0 = time.perf_counter()
                vecs[name] = runners[name](texts)
                speeds[name].append(tokens / (time.perf_counter() - t0))

    ref_name = ST if ST in speeds else mb.PACKAGED_INT8
    ref = vecs[mb.BUILT_FP32]
    print(f"texts: {len(texts)} {source}; {tokens} tokens (truncation {mb.MAX_TOKENS}); "
          f"threads {args.threads}; batches of 32 sorted by length; {args.rounds} interleaved rounds; "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"build+verify: {build_s:.1f} s; verification: "
          + ", ".join(f"{k} {v}" for k, v in info["verification"].items()
                      if k.startswith(("fp32", "int8"))))
    print(f"{'variant':<28}{'tokens/s min/med/max':>24}{f'x {ref_name} min/med/max':>40}"
          f"{'cos mean':>10}{'cos min':>9}")
    for name in [*mb.VARIANTS, ST]:
        if name not in speeds:
            print(f"{name:<28}{'(not installed)':>24}")
            continue
        cos = np.sum(vecs[name] * ref, axis=1)
        ratio = [a / b for a, b in zip(speeds[name], speeds[ref_name], strict=True)]
        print(f"{name:<28}{spread(speeds[name], ',.0f'):>24}{spread(ratio, '.2f'):>40}"
              f"{cos.mean():>10.4f}{cos.min():>9.4f}")
    print("cosine is against built-fp32; target: built-int8 >= 1.8x ST fp32 with cosine >= 0.99")


if __name__ == "__main__":
    main()
