"""The self-built MiniLM ONNX models: faithful to the weights, deterministic, and gated.

Everything here is real: the shipped safetensors weights, the packaged int8 model,
onnxruntime sessions, and a plain numpy forward pass of BERT as the reference.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from localkb.embedding import build as mb
from localkb.embedding.verified import sha256_file
from localkb.errors import EmbeddingUnavailable

pytestmark = pytest.mark.slow

_erf = np.frompyfunc(math.erf, 1, 1)


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("minilm-built")
    mb.build(out)
    return out


@pytest.fixture(scope="session")
def tokenizer():
    return mb.load_tokenizer()


@pytest.fixture(scope="session")
def weights() -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(str(mb.weights_dir() / "model.safetensors"))


@pytest.fixture(scope="session")
def config() -> dict:
    return json.loads((mb.weights_dir() / "config.json").read_text())


@pytest.fixture(scope="session")
def vectors(built: Path, tokenizer) -> dict[str, np.ndarray]:
    paths = mb.variant_paths(built)
    return {
        name: mb.embed_with(mb.open_session(paths[name]), tokenizer, mb.VERIFY_TEXTS)
        for name in mb.VARIANTS
    }


def _layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w + b


def _reference_embedding(ids: list[int], w: dict[str, np.ndarray], cfg: dict) -> np.ndarray:
    """BERT forward pass of one unpadded sequence in float64, mean-pooled and normalised."""
    g = {k: v.astype(np.float64) for k, v in w.items() if v.dtype == np.float32}
    eps = cfg["layer_norm_eps"]
    heads = cfg["num_attention_heads"]
    n = len(ids)
    x = (g["embeddings.word_embeddings.weight"][ids]
         + g["embeddings.position_embeddings.weight"][:n]
         + g["embeddings.token_type_embeddings.weight"][0])
    x = _layer_norm(x, g["embeddings.LayerNorm.weight"], g["embeddings.LayerNorm.bias"], eps)
    d = x.shape[1] // heads

    def lin(t: np.ndarray, p: str) -> np.ndarray:
        return t @ g[p + ".weight"].T + g[p + ".bias"]

    for i in range(cfg["num_hidden_layers"]):
        p = f"encoder.layer.{i}."
        q = lin(x, p + "attention.self.query").reshape(n, heads, d).transpose(1, 0, 2)
        k = lin(x, p + "attention.self.key").reshape(n, heads, d).transpose(1, 0, 2)
        v = lin(x, p + "attention.self.value").reshape(n, heads, d).transpose(1, 0, 2)
        scores = q @ k.transpose(0, 2, 1) / math.sqrt(d)
        scores -= scores.max(-1, keepdims=True)
        probs = np.exp(scores)
        probs /= probs.sum(-1, keepdims=True)
        ctx = (probs @ v).transpose(1, 0, 2).reshape(n, heads * d)
        x = _layer_norm(lin(ctx, p + "attention.output.dense") + x,
                        g[p + "attention.output.LayerNorm.weight"],
                        g[p + "attention.output.LayerNorm.bias"], eps)
        h = lin(x, p + "intermediate.dense")
        h = 0.5 * h * (1.0 + _erf(h / math.sqrt(2.0)).astype(np.float64))
        x = _layer_norm(lin(h, p + "output.dense") + x, g[p + "output.LayerNorm.weight"],
                        g[p + "output.LayerNorm.bias"], eps)
    pooled = x.mean(axis=0)
    return pooled / np.linalg.norm(pooled)


def test_verification_texts_include_passages_past_the_shipped_128_cut(tokenizer) -> None:
    lengths = [len(e.ids) for e in tokenizer.encode_batch(list(mb.VERIFY_PASSAGES))]
    assert min(lengths) > 128
    assert max(lengths) >= 200


def test_built_fp32_matches_numpy_reference(vectors, tokenizer, weights, config) -> None:
    encodings = tokenizer.encode_batch(list(mb.VERIFY_TEXTS))
    reference = np.stack([_reference_embedding(e.ids, weights, config) for e in encodings])
    cos = np.sum(reference * vectors[mb.BUILT_FP32], axis=1)
    assert cos.min() >= 0.9999, cos


def test_built_fp32_agrees_with_packaged_int8(vectors) -> None:
    cos = np.sum(vectors[mb.BUILT_FP32] * vectors[mb.PACKAGED_INT8], axis=1)
    assert cos.mean() >= 0.999, cos


def test_built_int8_stays_close_to_fp32_on_every_text(vectors) -> None:
    cos = np.sum(vectors[mb.BUILT_INT8] * vectors[mb.BUILT_FP32], axis=1)
    assert cos.mean() >= 0.99, cos
    assert cos.min() >= 0.98, cos


def test_built_graph_has_packaged_io_and_dynamic_axes(built: Path) -> None:
    packaged = mb.open_session(mb.packaged_model_path())
    for name in (mb.FP32_NAME, mb.INT8_NAME):
        session = mb.open_session(built / name)
        assert [(i.name, i.type) for i in session.get_inputs()] == [
            (i.name, i.type) for i in packaged.get_inputs()]
        assert [o.name for o in session.get_outputs()] == ["last_hidden_state"]
        for batch, seq in ((1, 3), (5, 300)):
            ids = np.full((batch, seq), 1037, dtype=np.int64)
            feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids),
                     "token_type_ids": np.zeros_like(ids)}
            (hidden,) = session.run(["last_hidden_state"], feeds)
            assert hidden.shape == (batch, seq, 384)


@pytest.mark.parametrize("name", [mb.FP32_NAME, mb.INT8_NAME])
def test_a_vector_does_not_depend_on_the_texts_batched_with_it(built: Path, tokenizer,
                                                                name: str) -> None:
    # A text's vector is a function of the text: the same alone (how a question is
    # embedded) as in a batch, padded by ~240 tokens beside a 256-token passage, or next
    # to other texts whose activations are larger (how an ingest embeds passages, its
    # batches depending on what the reader had ready).
    session = mb.open_session(built / name)
    texts = list(mb.VERIFY_TEXTS)
    together = mb.embed_with(session, tokenizer, texts)
    alone = np.concatenate([mb.embed_with(session, tokenizer, [t]) for t in texts])
    cos = np.sum(alone * together, axis=1)
    assert cos.min() >= 0.99999, cos


def test_build_records_inputs_outputs_and_verification(built: Path) -> None:
    info = json.loads((built / mb.BUILD_JSON).read_text())
    assert info["verified"] is True
    assert info["inputs"]["weights_sha256"] == mb.WEIGHTS_SHA256
    for name in (mb.FP32_NAME, mb.INT8_NAME):
        assert info["outputs"][name]["sha256"] == sha256_file(built / name)
    assert "per output channel" in info["params"]["quantization"]["weights"]
    assert "per token" in info["params"]["quantization"]["activations"]
    assert info["verification"]["int8_vs_fp32_min"] >= 0.98
    assert info["verification"]["int8_alone_vs_batched_min"] >= 0.99999
    assert "onnxruntime" in info["versions"]
    assert not [p.name for p in built.iterdir() if ".tmp" in p.name]


def test_rebuild_is_byte_identical(built: Path, tmp_path: Path) -> None:
    again = mb.build(tmp_path / "again", force=True)
    first = json.loads((built / mb.BUILD_JSON).read_text())
    for name in (mb.FP32_NAME, mb.INT8_NAME):
        assert again["outputs"][name]["sha256"] == first["outputs"][name]["sha256"]
        assert sha256_file(tmp_path / "again" / name) == sha256_file(built / name)


def test_build_is_a_noop_when_a_verified_build_is_up_to_date(built: Path) -> None:
    inodes = {name: (built / name).stat().st_ino for name in (mb.FP32_NAME, mb.INT8_NAME)}
    info = mb.build(built)
    assert info["verified"] is True
    assert {name: (built / name).stat().st_ino for name in inodes} == inodes


def test_corrupted_weights_are_refused(tmp_path: Path) -> None:
    src = mb.weights_dir()
    bad = tmp_path / "weights"
    bad.mkdir()
    shutil.copy(src / "config.json", bad / "config.json")
    shutil.copy(src / "model.safetensors", bad / "model.safetensors")
    with open(bad / "model.safetensors", "r+b") as fh:
        fh.seek(40_000_000)  # inside the word embeddings: still loads, silently wrong
        chunk = fh.read(16)
        fh.seek(40_000_000)
        fh.write(bytes(b ^ 0xFF for b in chunk))
    out = tmp_path / "out"
    with pytest.raises(EmbeddingUnavailable, match="sha256"):
        mb.build(out, weights=bad / "model.safetensors")
    assert not (out / mb.FP32_NAME).exists()
    assert not (out / mb.INT8_NAME).exists()


def test_tampered_built_model_fails_verification(built: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(built, copy)
    with open(copy / mb.INT8_NAME, "r+b") as fh:
        fh.seek(30_000_000)
        chunk = fh.read(64)
        fh.seek(30_000_000)
        fh.write(bytes(b ^ 0x55 for b in chunk))
    with pytest.raises(EmbeddingUnavailable, match="sha256"):
        mb.verify(copy)
    assert json.loads((copy / mb.BUILD_JSON).read_text())["verified"] is False


def test_wrong_weights_with_matching_hash_fail_the_cosine_gate(built: Path, tmp_path: Path) -> None:
    """A model whose bytes match build.json but whose numbers are wrong is still refused."""
    import onnx
    from onnx import numpy_helper

    copy = tmp_path / "copy"
    shutil.copytree(built, copy)
    model = onnx.load(str(copy / mb.FP32_NAME))
    for tensor in model.graph.initializer:
        if tensor.name == "encoder.layer.2.intermediate.dense.weight":
            array = numpy_helper.to_array(tensor)
            noisy = array + np.random.default_rng(0).normal(0, 0.05, array.shape).astype(
                np.float32)
            tensor.CopyFrom(numpy_helper.from_array(noisy, tensor.name))
    onnx.save_model(model, str(copy / mb.FP32_NAME))
    info = json.loads((copy / mb.BUILD_JSON).read_text())
    info["outputs"][mb.FP32_NAME]["sha256"] = sha256_file(copy / mb.FP32_NAME)
    (copy / mb.BUILD_JSON).write_text(json.dumps(info))

    with pytest.raises(EmbeddingUnavailable, match="below threshold") as caught:
        mb.verify(copy)
    figures = caught.value.detail["figures"]
    assert figures["fp32_vs_packaged_mean"] < 0.999
    after = json.loads((copy / mb.BUILD_JSON).read_text())
    assert after["verified"] is False
    assert after["verification"]["passed"] is False


def test_verify_without_a_build_is_refused(tmp_path: Path) -> None:
    with pytest.raises(EmbeddingUnavailable, match="build first"):
        mb.verify(tmp_path)


def test_measure_variants_reports_each_and_caches_per_cpu(built: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(built, copy)
    variants = mb.variant_paths(copy)
    texts = list(mb.VERIFY_TEXTS) * 3
    first = mb.measure_variants(variants, texts, rounds=2)
    assert set(first) == set(mb.VARIANTS)
    assert all(value > 0 for value in first.values())

    cached = json.loads((copy / mb.BUILD_JSON).read_text())["speed"][mb.cpu_fingerprint()]
    assert cached["texts"] == len(texts)
    # Every variant was timed in every round (interleaved), and the median stands for it.
    assert cached["rounds"] == 2
    for name, entry in cached["variants"].items():
        assert entry["rounds"] == 2
        assert entry["min"] <= entry["median"] <= entry["max"]
        assert first[name] == entry["median"]
    assert cached["variants"][mb.BUILT_INT8]["sha256"] == sha256_file(copy / mb.INT8_NAME)
    # A second call on the same texts and files reads the cache instead of re-timing.
    assert mb.measure_variants(variants, texts, rounds=2) == first

    other = mb.measure_variants(variants, texts[:5], rounds=2)
    assert set(other) == set(mb.VARIANTS)
    recached = json.loads((copy / mb.BUILD_JSON).read_text())["speed"][mb.cpu_fingerprint()]
    assert recached["texts"] == 5
