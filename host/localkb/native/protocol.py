"""Native-messaging framing and the shapes of the messages LocalKB exchanges.

This module knows bytes and message shapes, nothing else: no handlers, no threads.

Framing (both directions): a 4-byte unsigned length in native byte order, then that
many bytes of UTF-8 JSON. Browser -> host frames are capped at ``MAX_INCOMING``
(64 MiB); a bigger length means the stream is garbage or hostile and cannot be
resynchronised, so ``read_frame`` raises ``UntrustedLength``. Host -> browser frames
must stay below ``MAX_OUTGOING`` (1 MiB, Chrome's limit), measured in bytes after
UTF-8 encoding.

Shapes (the only place they are built)::

    request  {"id": <str|int>, "type": <str>, "data": {...}}      data may be omitted
    reply    {"id": ..., "ok": true,  "result": {...}}
    error    {"id": ..., "ok": false, "error": {"code", "message"[, "detail"]}}
    event    {"id": ..., "event": <name>, "data": {...}}

The error reply's ``id`` is ``null`` when the request id could not be read.

Parts. A reply or event whose frame would reach 1 MiB is sent as numbered ``part``
events carrying consecutive slices of the JSON text of its payload, followed by the
message itself with ``{"parts": n}`` in place of the payload::

    {"id": 7, "event": "part", "data": {"index": 0, "count": 3, "data": "{\\"hits\\": [..."}}
    {"id": 7, "event": "part", "data": {"index": 1, "count": 3, "data": "..."}}
    {"id": 7, "event": "part", "data": {"index": 2, "count": 3, "data": "...]}"}}
    {"id": 7, "ok": true, "result": {"parts": 3}}

The receiver concatenates the ``data`` strings in index order and parses the text as
JSON to get the real ``result`` (or event ``data``); ``join_parts`` does exactly that.
A receiver knows a payload was parted because part events for that id preceded it.

Error codes. Malformed requests raise ``ProtocolError`` (code ``protocol_error``) with
``detail={"reason": <one of REASONS>}``; replies for a type nobody handles use
``UNKNOWN_TYPE``; a handler's unexpected exception becomes ``INTERNAL_ERROR``.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from localkb import inputs
from localkb.errors import ProtocolError

MAX_INCOMING = 64 * 1024 * 1024
MAX_OUTGOING = 1024 * 1024
# Bytes of a part event that are not the chunk: the id (at most MAX_ID_CHARS chars, up
# to 12 bytes each once escaped), the index and count digits and the keys. 64 KiB is far
# more than that can reach, so every part frame stays below MAX_OUTGOING.
PART_OVERHEAD = 64 * 1024
PART_LIMIT = MAX_OUTGOING - PART_OVERHEAD

MAX_ID_CHARS = 256
MAX_TYPE_CHARS = 128
# Error messages are for people; a message longer than this is a bug somewhere else,
# and it must never push an error reply over the frame limit.
MAX_MESSAGE_CHARS = 4000

UNKNOWN_TYPE = "unknown_type"
INTERNAL_ERROR = "internal_error"
PART_EVENT = "part"

REASONS = (
    "truncated_frame",
    "frame_too_large",
    "invalid_utf8",
    "invalid_json",
    "not_an_object",
    "missing_id",
    "invalid_id",
    "missing_type",
    "invalid_type",
    "invalid_data",
    "duplicate_id",
    "invalid_parts",
    "too_many_values",
)

_HEADER = struct.Struct("=I")  # native byte order, exactly 4 bytes


class UntrustedLength(ProtocolError):
    """A frame header announced more than ``MAX_INCOMING`` bytes: the stream cannot be trusted."""

    def __init__(self, length: int) -> None:
        super().__init__(
            f"frame length {length} exceeds the {MAX_INCOMING}-byte limit",
            detail={"reason": "frame_too_large"},
        )
        self.length = length


class MessageTooLarge(ProtocolError):
    """An outgoing message would be ``MAX_OUTGOING`` bytes or more; send it in parts."""


class RequestError(ProtocolError):
    """A frame arrived whole but is not a valid request; ``request_id`` is set when readable."""

    def __init__(self, message: str, *, reason: str, request_id: Any = None) -> None:
        super().__init__(message, detail={"reason": reason})
        self.reason = reason
        self.request_id = request_id


@dataclass(frozen=True)
class Request:
    """One decoded request: ``id`` is a str or int, ``data`` always a dict.

    ``cost``: an upper estimate of the bytes the parsed request holds (its text, plus 64 bytes
    for each value it may hold), which the host's queue is bounded by.
    """

    id: str | int
    type: str
    data: dict
    cost: int = field(default=0, compare=False)


# --- reading ---------------------------------------------------------------------


def _read_exact(stream: BinaryIO, n: int) -> bytes:
    # Raw pipes may return short reads; loop until n bytes or EOF.
    chunks: list[bytes] = []
    remaining = n
    while remaining:
        chunk = stream.read(remaining)
        if not chunk:
            break
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def read_frame(stream: BinaryIO) -> bytes | None:
    """Read one frame body; ``None`` on a clean EOF before the header.

    Raises ``ProtocolError`` (reason ``truncated_frame``) when the stream ends inside a
    header or body, and ``UntrustedLength`` when the header exceeds ``MAX_INCOMING``.
    """
    header = _read_exact(stream, _HEADER.size)
    if not header:
        return None
    if len(header) < _HEADER.size:
        raise ProtocolError(
            f"truncated frame: {len(header)} of 4 header bytes",
            detail={"reason": "truncated_frame"},
        )
    (length,) = _HEADER.unpack(header)
    if length > MAX_INCOMING:
        raise UntrustedLength(length)
    body = _read_exact(stream, length)
    if len(body) < length:
        raise ProtocolError(
            f"truncated frame: {len(body)} of {length} bytes",
            detail={"reason": "truncated_frame"},
        )
    return body


def _valid_id(value: Any) -> bool:
    if isinstance(value, bool):  # bool is an int subclass; true/false are not ids
        return False
    if isinstance(value, int):
        return True
    return isinstance(value, str) and 0 < len(value) <= MAX_ID_CHARS


def decode_request(body: bytes) -> Request:
    """Decode a frame body into a ``Request`` or raise ``RequestError`` with a stable reason.

    The body is parsed by ``inputs.loads``, the team server's parser too; nesting past its
    limit is ``InvalidInput`` naming the field (id null: the frame could not be read).
    """
    try:
        obj, values = inputs.loads(body)
    except ProtocolError as err:
        raise RequestError(err.message, reason=err.detail["reason"]) from err
    if not isinstance(obj, dict):
        raise RequestError(
            f"request must be a JSON object, not {type(obj).__name__}", reason="not_an_object"
        )
    if "id" not in obj:
        raise RequestError("request has no id", reason="missing_id")
    request_id = obj["id"]
    if not _valid_id(request_id):
        raise RequestError(
            f"request id must be an integer or a string of 1-{MAX_ID_CHARS} characters",
            reason="invalid_id",
        )
    if "type" not in obj:
        raise RequestError("request has no type", reason="missing_type", request_id=request_id)
    kind = obj["type"]
    if not isinstance(kind, str) or not 0 < len(kind) <= MAX_TYPE_CHARS:
        raise RequestError(
            f"request type must be a string of 1-{MAX_TYPE_CHARS} characters",
            reason="invalid_type",
            request_id=request_id,
        )
    data = obj.get("data", {})
    if not isinstance(data, dict):
        raise RequestError(
            "request data must be a JSON object", reason="invalid_data", request_id=request_id
        )
    return Request(request_id, kind, data, cost=len(body) + 64 * values)


# --- shapes ----------------------------------------------------------------------


def reply(request_id: Any, result: Mapping[str, Any]) -> dict:
    """The success reply shape."""
    return {"id": request_id, "ok": True, "result": result}


def error_reply(
    request_id: Any, code: str, message: str, detail: Mapping[str, Any] | None = None
) -> dict:
    """The error reply shape; ``detail`` is included only when non-empty."""
    error: dict[str, Any] = {"code": code, "message": message}
    if detail:
        error["detail"] = dict(detail)
    return {"id": request_id, "ok": False, "error": error}


def event(request_id: Any, name: str, data: Mapping[str, Any]) -> dict:
    """The event shape (progress, streamed tokens, parts)."""
    return {"id": request_id, "event": name, "data": data}


# --- writing ---------------------------------------------------------------------


def _dumps(obj: Any) -> bytes:
    try:
        return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode(
            "utf-8"
        )
    except UnicodeEncodeError:
        # A lone surrogate (e.g. from a surrogate-escaped filename) cannot be UTF-8;
        # ASCII escapes keep the frame valid UTF-8 and the JSON still parses.
        return json.dumps(obj, ensure_ascii=True, separators=(",", ":"), allow_nan=False).encode(
            "ascii"
        )


def _frame(body: bytes) -> bytes:
    if len(body) >= MAX_OUTGOING:
        raise MessageTooLarge(
            f"message of {len(body)} bytes reaches the {MAX_OUTGOING}-byte limit",
            detail={"reason": "frame_too_large"},
        )
    return _HEADER.pack(len(body)) + body


def encode_frame(obj: Any) -> bytes:
    """Encode ``obj`` as one frame; raise ``MessageTooLarge`` at 1 MiB or more of UTF-8."""
    return _frame(_dumps(obj))


def split_parts(payload: bytes | str, limit: int = PART_LIMIT) -> list[str]:
    """Split JSON text into ordered chunks whose JSON-string encodings fit in ``limit`` bytes.

    Joining the chunks gives back ``payload`` exactly (decoded as UTF-8 if bytes). The
    limit counts the escaped form (quotes and backslashes doubled, control characters
    as \\uXXXX) because that is what the chunk costs inside a part event's frame.
    """
    if limit < 16:
        raise ValueError("limit must leave room for at least one escaped character")
    text = payload.decode("utf-8") if isinstance(payload, bytes) else payload
    chunks: list[str] = []
    start = 0
    while start < len(text):
        # Guess the whole budget in characters, then shrink in proportion to the
        # measured cost: JSON text is mostly 1 byte per character, so this converges
        # in a step or two instead of measuring character by character.
        size = min(limit, len(text) - start)
        while True:
            cost = len(_dumps(text[start : start + size])) - 2
            if cost <= limit:
                break
            size = max(1, min(size - 1, size * limit // cost))
        chunks.append(text[start : start + size])
        start += size
    return chunks


def _parted(request_id: Any, payload: Any) -> tuple[list[bytes], int]:
    chunks = split_parts(_dumps(payload))
    count = len(chunks)
    frames = [
        _frame(_dumps(event(request_id, PART_EVENT, {"index": i, "count": count, "data": c})))
        for i, c in enumerate(chunks)
    ]
    return frames, count


def reply_frames(request_id: Any, result: Mapping[str, Any]) -> list[bytes]:
    """Frames for a success reply: one frame, or part events then ``{"parts": n}``."""
    body = _dumps(reply(request_id, result))
    if len(body) < MAX_OUTGOING:
        return [_frame(body)]
    frames, count = _parted(request_id, result)
    return [*frames, encode_frame(reply(request_id, {"parts": count}))]


def event_frames(request_id: Any, name: str, data: Mapping[str, Any]) -> list[bytes]:
    """Frames for an event: one frame, or part events then the event with ``{"parts": n}``."""
    if name == PART_EVENT:
        raise ValueError(f"event name {PART_EVENT!r} is reserved for the parts convention")
    body = _dumps(event(request_id, name, data))
    if len(body) < MAX_OUTGOING:
        return [_frame(body)]
    frames, count = _parted(request_id, data)
    return [*frames, encode_frame(event(request_id, name, {"parts": count}))]


def error_frame(
    request_id: Any, code: str, message: str, detail: Mapping[str, Any] | None = None
) -> bytes:
    """One error frame that always fits: the message is clipped, an oversized detail dropped."""
    if len(message) > MAX_MESSAGE_CHARS:
        message = message[:MAX_MESSAGE_CHARS] + "…"
    try:
        return encode_frame(error_reply(request_id, code, message, detail))
    except (MessageTooLarge, TypeError, ValueError):
        # The detail is optional context; the code and message must get through.
        return encode_frame(error_reply(request_id, code, message))


# --- reassembly (for Python clients: tests, the installer's check) -----------------


def join_parts(parts: Iterable[Mapping[str, Any]]) -> Any:
    """Rebuild a parted payload from the ``data`` of its part events (any order)."""
    by_index: dict[int, str] = {}
    count = None
    for part in parts:
        index, n, chunk = part.get("index"), part.get("count"), part.get("data")
        if not (isinstance(index, int) and isinstance(n, int) and isinstance(chunk, str)):
            raise ProtocolError("malformed part", detail={"reason": "invalid_parts"})
        if count is None:
            count = n
        if n != count or not 0 <= index < n or index in by_index:
            raise ProtocolError("inconsistent parts", detail={"reason": "invalid_parts"})
        by_index[index] = chunk
    if count is None or len(by_index) != count:
        raise ProtocolError(
            f"expected {count} parts, got {len(by_index)}", detail={"reason": "invalid_parts"}
        )
    return json.loads("".join(by_index[i] for i in range(count)))
