"""Embedding speed and fidelity of every MiniLM variant, side by side, on the same texts.

    python bench/embed.py [--texts 400] [--threads 2] [--out DIR]

Texts: the first N SciFact abstracts from ../shared/datasets/beir-scifact/corpus.jsonl
(relative to the repository root), or generated text when that file is absent.
Variants: packaged-int8, built-fp32, built-int8 (built into a temporary folder unless
--out is given), and sentence-transformers fp32 on torch when it is importable.
Prints tokens/s, the ratio to sentence-transformers, and the cosine with built-fp32.
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
SCIFACT = REPO.parent / "shared" / "datasets" / "beir-scifact" / "corpus.jsonl"

sys.path.insert(0, str(REPO / "host"))
from localkb import modelbuild as mb  # noqa: E402


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


def sentence_transformers_run(texts: list[str], threads: int,
                              tokens: int) -> tuple[float, np.ndarray] | None:
    """(tokens/s, vectors) of sentence-transformers fp32 on torch, or None if not installed."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import torch
        from sentence_transformers import SentenceTransformer
    except ImportError:
        return None
    torch.set_num_threads(threads)
    model = SentenceTransformer(str(mb.weights_dir()), device="cpu")
    model.max_seq_length = mb.MAX_TOKENS
    model.encode(texts[:32], batch_size=32)  # warm-up
    start = time.perf_counter()
    vecs = model.encode(texts, batch_size=32, normalize_embeddings=True,
                        convert_to_numpy=True)
    elapsed = time.perf_counter() - start
    return tokens / elapsed, np.asarray(vecs, dtype=np.float32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--texts", type=int, default=400)
    parser.add_argument("--threads", type=int, default=2)
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
        paths = mb.variant_paths(out)
        speed = mb.measure_variants(paths, texts, out_dir=out, threads=args.threads)
        vecs = {name: mb.embed_with(mb.open_session(path, args.threads), tok, texts)
                for name, path in paths.items()}

    st = sentence_transformers_run(texts, args.threads, tokens)
    if st is not None:
        speed["sentence-transformers-fp32"] = st[0]
        vecs["sentence-transformers-fp32"] = st[1]

    ref = vecs[mb.BUILT_FP32]
    st_speed = speed.get("sentence-transformers-fp32")
    print(f"texts: {len(texts)} {source}; {tokens} tokens (truncation {mb.MAX_TOKENS}); "
          f"threads {args.threads}; batches of 32 sorted by length")
    print(f"build+verify: {build_s:.1f} s; verification: "
          + ", ".join(f"{k} {v}" for k, v in info["verification"].items()
                      if k.startswith(("fp32", "int8"))))
    print(f"{'variant':<28}{'tokens/s':>10}{'x vs ST':>9}{'cos mean':>10}{'cos min':>9}")
    for name in [*mb.VARIANTS, "sentence-transformers-fp32"]:
        if name not in speed:
            print(f"{name:<28}{'(not installed)':>20}")
            continue
        cos = np.sum(vecs[name] * ref, axis=1)
        ratio = f"{speed[name] / st_speed:.2f}x" if st_speed else "n/a"
        print(f"{name:<28}{speed[name]:>10,.0f}{ratio:>9}{cos.mean():>10.4f}{cos.min():>9.4f}")
    print("cosine is against built-fp32; target: built-int8 >= 1.8x ST fp32 with cosine >= 0.99")


if __name__ == "__main__":
    main()
