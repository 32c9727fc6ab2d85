"""Model files are hashed once per file identity and again whenever that identity changes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from localkb.embedding import verified
from localkb.embedding.files import check_sha256
from localkb.embedding.verified import sha256_file
from localkb.errors import EmbeddingUnavailable


@pytest.fixture
def record(tmp_path: Path):
    verified.forget()
    verified.use_folder(tmp_path / "models")
    yield tmp_path / "models" / verified.RECORD_NAME
    verified.forget()
    verified.use_folder(Path(os.environ["LOCALKB_MODEL_DIR"]) / "minilm-built")


def test_a_second_process_reads_the_record_instead_of_hashing(tmp_path: Path, record: Path) -> None:
    model = tmp_path / "model.onnx"
    model.write_bytes(b"weights" * 1000)
    expected = sha256_file(model)
    before = verified.hashed_count()
    check_sha256(model, expected, "the model")
    assert verified.hashed_count() == before + 1
    assert record.is_file()
    verified.forget()  # as a new process would start: nothing in memory, the record on disk
    check_sha256(model, expected, "the model")
    check_sha256(model, expected, "the model")
    assert verified.hashed_count() == before + 1


def test_a_file_rewritten_with_the_same_size_and_mtime_is_hashed_again(tmp_path: Path,
                                                                        record: Path) -> None:
    model = tmp_path / "model.onnx"
    model.write_bytes(b"a" * 4096)
    expected = sha256_file(model)
    check_sha256(model, expected, "the model")
    st = model.stat()
    with open(model, "r+b") as fh:  # same inode, same size
        fh.write(b"b")
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns))  # mtime put back; ctime moves anyway
    verified.forget()
    before = verified.hashed_count()
    with pytest.raises(EmbeddingUnavailable, match="not the verified file"):
        check_sha256(model, expected, "the model")
    assert verified.hashed_count() == before + 1


def test_a_replaced_file_is_hashed_again(tmp_path: Path, record: Path) -> None:
    model = tmp_path / "model.onnx"
    model.write_bytes(b"a" * 4096)
    check_sha256(model, sha256_file(model), "the model")
    other = tmp_path / "other.onnx"
    other.write_bytes(b"c" * 4096)
    os.replace(other, model)  # a new inode under the old name
    before = verified.hashed_count()
    assert verified.sha256_of(model) == sha256_file(model)
    assert verified.hashed_count() == before + 1
