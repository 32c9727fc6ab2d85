"""The team server's access log: one JSON line per request, keyed by its request id.

The id is the client's ``X-Request-Id`` when it sent a short, plain one (a proxy's), else a
new random one; it is returned as ``X-Request-Id`` on every reply, streams included, so a
user's report, the proxy's log and this one meet on it. Lines go to the
``localkb.team.access`` logger (``team serve --access-log``: stderr by default, a file, or off).
"""

from __future__ import annotations

import json
import logging
import re
import secrets
import time
from typing import Any

log = logging.getLogger("localkb.team.access")
_CLIENT_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")


def request_id(sent: str | None) -> str:
    """The request's id: the client's when it is plain and short, else a new one."""
    if sent and _CLIENT_ID.fullmatch(sent):
        return sent
    return secrets.token_hex(8)


def record(**fields: Any) -> None:
    """One line for one answered request (nothing is built when the log is off)."""
    if log.isEnabledFor(logging.INFO):
        log.info(json.dumps({"ts": round(time.time(), 3), **fields}, ensure_ascii=False, default=str))


def configure(target: str | None) -> None:
    """``-``: stderr; a path: that file (appended); None or ``off``: no access log."""
    log.propagate = False
    for h in list(log.handlers):
        log.removeHandler(h)
    if target in (None, "", "off"):
        log.setLevel(logging.WARNING)
        return
    handler = logging.StreamHandler() if target == "-" else logging.FileHandler(target)
    handler.setFormatter(logging.Formatter("%(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
