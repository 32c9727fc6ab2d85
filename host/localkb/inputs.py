"""JSON from outside, parsed and checked once: the one input edge of the host's frames and the
team server's HTTP bodies.

``loads`` bounds what a body may cost before and while it is parsed: at most ``MAX_VALUES``
values (counted before any object is built) and nesting no deeper than the parser can
follow. ``check_value`` then walks the parsed value once, without recursion, and refuses
any string or key that cannot be text (a lone surrogate, a NUL: ``strings.string_problem``),
any number that is not finite, and nesting deeper than ``MAX_DEPTH``, each as
``InvalidInput`` naming the field (``detail.field``: ``history[1].content``). The ``req_*``
readers take one field each, with its type and bounds.

Errors: a body that is not UTF-8 JSON or holds too many values is ``ProtocolError`` with
``detail.reason`` (``invalid_utf8``, ``invalid_json``, ``too_many_values``); everything about
one field is ``InvalidInput``.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from collections.abc import Mapping
from typing import Any

from localkb.errors import InvalidInput, ProtocolError
from localkb.strings import string_problem

#: Values (objects, lists, strings, numbers...) one request may hold. The largest real request
#: (a chat with 50 history turns each naming its knowledge bases) holds a few thousand; a
#: body of 64 MiB of ``{},{},...`` holds 21 million, and parsed that would take the process to
#: gigabytes. Big payloads are single strings, which count once however long they are.
MAX_VALUES = 200_000
#: Containers one inside another. Real requests nest four deep (``history[0].kbs[0]``).
MAX_DEPTH = 64
#: A field path in an error names this many steps, then ``…``.
SHOWN_STEPS = 6
MAX_TEXT = 64 * 1024 * 1024


def count_values(body: bytes) -> int:
    """An upper bound of the values ``body`` holds; ``ProtocolError`` past ``MAX_VALUES``,
    before it is parsed into objects.

    Each value after the first in a list or object follows a comma, and each container opens
    with a bracket, so counting those bytes bounds the values from above; only a body over the
    limit by that count (a page full of commas in its text, say) is walked with a streaming
    parser that builds nothing and stops at the limit.
    """
    bound = body.count(b",") + body.count(b"{") + body.count(b"[")
    if bound <= MAX_VALUES:
        return bound
    import ijson

    n = 0
    try:
        for _event in ijson.basic_parse(body, use_float=True):
            n += 1
            if n > MAX_VALUES:
                raise ProtocolError(f"the request holds more than {MAX_VALUES:,} JSON values",
                                    detail={"reason": "too_many_values"})
    except (ijson.JSONError, UnicodeDecodeError):
        pass  # json.loads will say what is wrong with it
    return n


def loads(body: bytes) -> tuple[Any, int]:
    """Parse a UTF-8 JSON body: (the value, an upper bound of the values it holds).

    Nesting deeper than Python's parser recurses is ``InvalidInput`` naming where it starts;
    the parsed value is not checked further here (``check_value`` does that, once).
    """
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ProtocolError(f"the request is not valid UTF-8 (byte {err.start})",
                            detail={"reason": "invalid_utf8"}) from err
    values = count_values(body)
    try:
        return json.loads(text), values
    except ValueError as err:  # JSONDecodeError, and int strings past Python's digit limit
        raise ProtocolError(f"the request is not valid JSON: {err}",
                            detail={"reason": "invalid_json"}) from err
    except RecursionError:  # [[[[...]]]] nested deeper than the parser recurses
        pass
    field = _too_deep(text)
    raise InvalidInput(f"'{field}' is nested more than {MAX_DEPTH} levels deep",
                       detail={"field": field})


def check_value(value: object, where: str = "") -> None:
    """``InvalidInput`` naming the first string (or key) that cannot be text, number that is
    not finite (NaN, Infinity, ``1e999``), or container nested deeper than ``MAX_DEPTH``,
    anywhere in a decoded JSON value (``where`` names the value itself)."""
    stack: list[tuple[object, str, int]] = [(value, where, 0)]
    while stack:
        item, path, depth = stack.pop()
        if isinstance(item, str):
            problem = string_problem(item)
            if problem:
                raise InvalidInput(f"'{path}' {problem}", detail={"field": path})
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise InvalidInput(f"'{path}' must be a finite number", detail={"field": path})
        elif isinstance(item, dict | list):
            if depth >= MAX_DEPTH:
                raise InvalidInput(f"'{path}' is nested more than {MAX_DEPTH} levels deep",
                                   detail={"field": path})
            if isinstance(item, list):
                stack.extend((sub, _step(path, i, depth), depth + 1) for i, sub in enumerate(item))
                continue
            for key, sub in item.items():
                problem = string_problem(key)
                if problem:
                    field = _step(path, _printable(key), depth)
                    raise InvalidInput(f"the key '{field}' {problem}", detail={"field": field})
                stack.append((sub, _step(path, key, depth), depth + 1))


def parse_object(body: bytes) -> dict:
    """A request body that must be one JSON object, parsed and checked (``{}`` when empty)."""
    if not body:
        return {}
    data, _values = loads(body)
    if not isinstance(data, dict):
        raise ProtocolError("the body must be a JSON object", detail={"reason": "not_an_object"})
    check_value(data)
    return data


def _step(path: str, key: str | int, depth: int) -> str:
    """``path`` one step further down; past ``SHOWN_STEPS`` steps it ends in ``…``."""
    if depth >= SHOWN_STEPS:
        return path if path.endswith("…") else path + "…"
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def _printable(key: str) -> str:
    """A key for an error message: what cannot be text shown as U+FFFD."""
    return re.sub("[\x00\ud800-\udfff]", "\ufffd", key)


_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{},:]')


def _too_deep(text: str) -> str:
    """The path to where ``text`` (valid JSON so far) first nests ``MAX_DEPTH`` containers deep.

    Only reached when the parser gave up, so ``text`` holds at most ``MAX_VALUES`` values and
    this loop stops at the first container past the limit.
    """
    stack: list[list] = []  # [path of the container, next index or the last key, is a list]
    path, key_next = "", False
    for match in _TOKEN.finditer(text):
        tok = match.group()
        if tok in ("[", "{"):
            if stack:
                top = stack[-1]
                path = _step(top[0], top[1], len(stack) - 1)
            if len(stack) >= MAX_DEPTH:
                return path
            stack.append([path, 0 if tok == "[" else "", tok == "["])
            key_next = tok == "{"
        elif tok in ("]", "}"):
            if stack:
                stack.pop()
            key_next = False
        elif tok == ",":
            if stack and stack[-1][2]:
                stack[-1][1] += 1
            key_next = bool(stack) and not stack[-1][2]
        elif tok == ":":
            key_next = False
        elif key_next and stack:
            try:
                stack[-1][1] = _printable(json.loads(tok))
            except ValueError:
                stack[-1][1] = "?"
    return path


# -- one field each ---------------------------------------------------------------------------
def req_str(data: Mapping, key: str, *, max_len: int = 4096, required: bool = True,
            allow_empty: bool = False) -> str | None:
    value = data.get(key)
    if value is None:
        if required:
            raise InvalidInput(f"'{key}' is required", detail={"field": key})
        return None
    if not isinstance(value, str):
        raise InvalidInput(f"'{key}' must be a string", detail={"field": key})
    if len(value) > max_len:
        raise InvalidInput(f"'{key}' is longer than {max_len:,} characters", detail={"field": key})
    if not allow_empty and not value.strip():
        raise InvalidInput(f"'{key}' is empty", detail={"field": key})
    return value


def req_int(data: Mapping, key: str, default: int, *, lo: int, hi: int) -> int:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise InvalidInput(f"'{key}' must be an integer from {lo} to {hi}", detail={"field": key})
    return value


def req_bool(data: Mapping, key: str, default: bool = False) -> bool:
    value = data.get(key, default)
    if not isinstance(value, bool):
        raise InvalidInput(f"'{key}' must be true or false", detail={"field": key})
    return value


def req_kbs(data: Mapping) -> list[str]:
    """``kbs`` (a list of ids or names) or a single ``kb``."""
    if "kbs" in data:
        kbs = data["kbs"]
        if not isinstance(kbs, list) or not kbs or len(kbs) > 50 or not all(
                isinstance(k, str) and 0 < len(k) <= 200 for k in kbs):
            raise InvalidInput("'kbs' must be a non-empty list of knowledge-base ids or names",
                               detail={"field": "kbs"})
        return kbs
    return [req_str(data, "kb", max_len=200)]


def b64_bytes(data: Mapping, key: str, *, max_bytes: int = MAX_TEXT) -> bytes | None:
    raw = req_str(data, key, max_len=max_bytes * 4 // 3 + 8, required=False)
    if raw is None:
        return None
    try:
        return base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError) as err:
        raise InvalidInput(f"'{key}' is not valid base64", detail={"field": key}) from err
