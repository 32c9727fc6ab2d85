"""The encrypted envelope around an .awkb file: scrypt + AES-256-GCM, header as associated data.

Layout (all integers big-endian)::

    offset  size  field
    0       8     magic  b"AWKBENC\\x00"
    8       1     version (1)
    9       1     scrypt log2(n)
    10      1     scrypt r
    11      1     scrypt p
    12      16    salt (random)
    28      12    nonce (random)
    40      ...   AES-256-GCM ciphertext of the .awkb bytes
    end-16  16    GCM tag

The 40 header bytes are the associated data, so a changed parameter, salt or
version fails authentication like a changed ciphertext byte. The key is
scrypt(passphrase, salt, n, r, p) -> 32 bytes. Parameters read from a file are
bounded before use, so a hostile header cannot ask for gigabytes of memory.
Decryption streams into the caller's file, and nothing in it may be used
until ``open_envelope`` returns (the tag is checked last).
"""

from __future__ import annotations

import os
import struct
from typing import BinaryIO

from localkb.errors import DecryptionFailed, InvalidArchive, PassphraseRequired

MAGIC = b"AWKBENC\x00"
VERSION = 1
HEADER = struct.Struct(">8sBBBB16s12s")
HEADER_SIZE = HEADER.size
TAG_SIZE = 16
#: scrypt n = 2**15, r = 8, p = 1: 32 MiB of memory, about 0.1 s per derivation.
DEFAULT_LOG2_N = 15
DEFAULT_R = 8
DEFAULT_P = 1
# A file may ask for more work than we would choose, but never beyond this.
MAX_LOG2_N = 20
MAX_R = 16
MAX_P = 4
MAX_SCRYPT_MEMORY = 256 * 1024 * 1024  # scrypt needs 128 * r * n bytes
BLOCK = 1 << 20


def is_envelope(head: bytes) -> bool:
    """Whether the first bytes of a file are the envelope's magic."""
    return head[: len(MAGIC)] == MAGIC


def _key(passphrase: str, salt: bytes, log2_n: int, r: int, p: int) -> bytes:
    from cryptography.hazmat.primitives.kdf.scrypt import Scrypt

    n = 1 << log2_n
    kdf = Scrypt(salt=salt, length=32, n=n, r=r, p=p)
    return kdf.derive(passphrase.encode("utf-8"))


def _check_passphrase(passphrase: str | None) -> str:
    if passphrase is None or passphrase == "":
        raise PassphraseRequired("this file is encrypted: a passphrase is required")
    if not isinstance(passphrase, str):
        raise DecryptionFailed("the passphrase must be text")
    return passphrase


def seal(src: BinaryIO, dst: BinaryIO, passphrase: str, *, log2_n: int = DEFAULT_LOG2_N,
         r: int = DEFAULT_R, p: int = DEFAULT_P) -> int:
    """Encrypt everything readable from ``src`` into ``dst``; return the bytes written."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    if not passphrase:
        raise PassphraseRequired("encrypting needs a non-empty passphrase")
    salt, nonce = os.urandom(16), os.urandom(12)
    header = HEADER.pack(MAGIC, VERSION, log2_n, r, p, salt, nonce)
    enc = Cipher(algorithms.AES(_key(passphrase, salt, log2_n, r, p)), modes.GCM(nonce)).encryptor()
    enc.authenticate_additional_data(header)
    dst.write(header)
    written = len(header)
    for block in iter(lambda: src.read(BLOCK), b""):
        out = enc.update(block)
        dst.write(out)
        written += len(out)
    tail = enc.finalize() + enc.tag
    dst.write(tail)
    return written + len(tail)


def open_envelope(src: BinaryIO, dst: BinaryIO, passphrase: str | None, *, size: int) -> int:
    """Decrypt the envelope in ``src`` (``size`` bytes long) into ``dst``; return plaintext bytes.

    Raises ``PassphraseRequired`` without a passphrase, ``DecryptionFailed`` for a
    wrong passphrase or any tampering, ``InvalidArchive`` for a header that is not
    an envelope this version reads. ``dst`` holds unauthenticated bytes until
    this returns; on an exception the caller must discard it.
    """
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    header = src.read(HEADER_SIZE)
    if len(header) < HEADER_SIZE or size < HEADER_SIZE + TAG_SIZE:
        raise InvalidArchive("encrypted file: truncated before the end of its header")
    magic, version, log2_n, r, p, salt, nonce = HEADER.unpack(header)
    if magic != MAGIC:
        raise InvalidArchive("not an encrypted LocalKB file")
    if version != VERSION:
        raise InvalidArchive(f"encrypted file: envelope version {version} is not supported "
                             f"(this host reads version {VERSION})")
    if not (1 <= log2_n <= MAX_LOG2_N and 1 <= r <= MAX_R and 1 <= p <= MAX_P
            and 128 * r * (1 << log2_n) <= MAX_SCRYPT_MEMORY):
        raise InvalidArchive(f"encrypted file: scrypt parameters n=2^{log2_n}, r={r}, p={p} "
                             "are outside the accepted range")
    passphrase = _check_passphrase(passphrase)
    try:
        key = _key(passphrase, salt, log2_n, r, p)
    except (ValueError, MemoryError) as err:
        raise InvalidArchive(f"encrypted file: scrypt parameters rejected: {err}") from err
    dec = Cipher(algorithms.AES(key), modes.GCM(nonce)).decryptor()
    dec.authenticate_additional_data(header)
    remaining = size - HEADER_SIZE - TAG_SIZE
    written = 0
    while remaining:
        block = src.read(min(BLOCK, remaining))
        if not block:
            raise DecryptionFailed("the encrypted file is truncated")
        remaining -= len(block)
        out = dec.update(block)
        dst.write(out)
        written += len(out)
    tag = src.read(TAG_SIZE)
    if len(tag) != TAG_SIZE or src.read(1):
        raise DecryptionFailed("the encrypted file is truncated or has extra bytes")
    try:
        dst.write(dec.finalize_with_tag(tag))
    except InvalidTag as err:
        raise DecryptionFailed("wrong passphrase, or the encrypted file was altered") from err
    return written
