"""Secrets out of text that is logged or shown: the one redaction every error path uses.

A server may echo the request's ``Authorization`` header or the key itself in an error body,
and that body is quoted in error messages, the error log, the host log and replies. ``redact``
replaces the given secrets and anything shaped like a bearer token or an ``sk-`` key.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

MARK = "[redacted]"
# "Bearer <token>" in any case, and OpenAI-style keys (sk-..., sk-proj-..., sk-ant-...).
_SHAPES = re.compile(r"(?i)\b(bearer)\s+[A-Za-z0-9._~+/=-]{6,}|\bsk-[A-Za-z0-9_-]{8,}")


def redact(text: str, secrets: Iterable[str | None] = ()) -> str:
    """``text`` with every secret in ``secrets`` (of 4+ characters) and every key shape masked."""
    if not isinstance(text, str):
        return text
    for secret in sorted({s for s in secrets if isinstance(s, str) and len(s) >= 4},
                         key=len, reverse=True):
        text = text.replace(secret, MARK)
    return _SHAPES.sub(lambda m: f"{m.group(1)} {MARK}" if m.group(1) else MARK, text)
