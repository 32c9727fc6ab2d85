"""A real LocalKB host loop (localkb.native.host.main) serving handlers made for native.js's tests.

Same framing, threading, parts and cancel as the product host; only the handler table is
the test's: a payload big enough to be sent in parts, events before a reply, an error, a
request that waits until it is cancelled, and a command to exit mid-request.
"""

import os
import sys
import time

from localkb.errors import KnowledgeBaseNotFound
from localkb.native.host import main


def big(data, ctx):
    # ~3 MB of JSON with multi-byte characters: the host must split it into parts.
    rows = [{"n": i, "text": f'passage {i} · é ✓ "q" ' + "x" * 200} for i in range(12000)]
    return {"rows": rows}


def events(data, ctx):
    for i in range(3):
        ctx.emit("progress", {"stage": "embed", "done": i + 1, "total": 3})
    ctx.emit("token", {"text": "y" * 1_500_000})  # an event large enough to be parted too
    return {"done": True}


def fail(data, ctx):
    raise KnowledgeBaseNotFound("no knowledge base 'nope'", detail={"kb": "nope"})


def wait_for_cancel(data, ctx):
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ctx.check_cancelled()
        time.sleep(0.01)
    return {"timed_out": True}


def die(data, ctx):
    os._exit(7)


if __name__ == "__main__":
    sys.exit(
        main(
            handlers={
                "status": lambda data, ctx: {"host_version": "test", "protocol_version": 1},
                "big": big,
                "events": events,
                "fail": fail,
                "wait": wait_for_cancel,
                "die": die,
            }
        )
    )
