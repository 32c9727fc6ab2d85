"""A real host subprocess spoken to with framed bytes, for any test that needs one.

Client side::

    from hostproc import HostProcess, tiny_host_argv

    with HostProcess(tiny_host_argv(), home=tmp_path) as host:   # the tiny test table
        host.send({"id": 1, "type": "echo", "data": {"x": 1}})
        msgs = host.until_reply(1)          # events for id 1, then its final reply last
        assert msgs[-1]["result"] == {"x": 1}

Use ``HostProcess([sys.executable, "-m", "localkb", "host"], home=...)`` for the real
handlers. Parted payloads are reassembled by ``until_reply``/``reassembled``; the raw
frames are kept in ``HostProcess.raw`` so tests can check every frame's size.

Server side: ``python tests/hostproc.py`` runs ``localkb.native.host.main`` with the
``TEST_HANDLERS`` table below (echo, slow-with-progress, big results, failures).
"""

from __future__ import annotations

import json
import os
import queue
import struct
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

HEADER = struct.Struct("=I")
HERE = Path(__file__).resolve()
DEFAULT_WAIT = 60.0  # a hang guard only: nothing here passes or fails on elapsed time


def frame(body: bytes) -> bytes:
    """Frame raw bytes exactly as the browser would."""
    return HEADER.pack(len(body)) + body


def frame_json(obj: Any) -> bytes:
    return frame(json.dumps(obj).encode("utf-8"))


def tiny_host_argv() -> list[str]:
    """argv that starts a host serving ``TEST_HANDLERS``."""
    return [sys.executable, str(HERE)]


class HostGone(AssertionError):
    """The host closed stdout before the expected message arrived."""


class HostProcess:
    """A host subprocess with a reader thread collecting every frame it writes."""

    def __init__(self, argv: list[str], *, home: Path, env: dict | None = None,
                 umask: int = -1) -> None:
        full_env = {**os.environ, "LOCALKB_HOME": str(home), **(env or {})}
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=full_env,
            umask=umask,  # -1: inherit this process's umask
        )
        self.raw: list[bytes] = []  # every frame body, in arrival order
        self.others: list[dict] = []  # messages skipped by until_reply (other ids)
        self._messages: queue.Queue[dict | None] = queue.Queue()
        self._stderr: list[bytes] = []
        self.stdout_garbage = b""  # bytes that did not form a whole frame
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._err_reader = threading.Thread(target=self._read_err, daemon=True)
        self._err_reader.start()

    # -- plumbing --

    def _read(self) -> None:
        out = self.proc.stdout
        assert out is not None
        while True:
            header = out.read(HEADER.size)
            if len(header) < HEADER.size:
                self.stdout_garbage += header
                break
            (length,) = HEADER.unpack(header)
            body = out.read(length)
            if len(body) < length:
                self.stdout_garbage += header + body
                break
            self.raw.append(body)
            try:
                self._messages.put(json.loads(body.decode("utf-8")))
            except ValueError:
                self.stdout_garbage += header + body
                break
        self._messages.put(None)

    def _read_err(self) -> None:
        err = self.proc.stderr
        assert err is not None
        for line in iter(err.readline, b""):
            self._stderr.append(line)

    # -- sending --

    def send_raw(self, data: bytes) -> None:
        """Write bytes as they are (framed or not) to the host's stdin."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def send_body(self, body: bytes) -> None:
        self.send_raw(frame(body))

    def send(self, obj: Any) -> None:
        self.send_raw(frame_json(obj))

    def close_stdin(self) -> None:
        assert self.proc.stdin is not None
        if not self.proc.stdin.closed:
            self.proc.stdin.close()

    # -- receiving --

    def next_message(self, timeout: float = DEFAULT_WAIT) -> dict:
        msg = self._messages.get(timeout=timeout)
        if msg is None:
            self._messages.put(None)  # keep reporting the end to later callers
            raise HostGone(f"host closed stdout; stderr:\n{self.stderr_text()}")
        return msg

    def until_reply(self, request_id: Any, timeout: float = DEFAULT_WAIT) -> list[dict]:
        """Messages for ``request_id`` up to and including its final reply.

        Messages for other ids are kept in ``self.others`` (and claimed from there by a
        later call for their id). Parted payloads are reassembled: the returned
        reply/event carries the real ``result``/``data`` and ``"_parts": n`` so tests can
        tell it travelled in parts.
        """
        from localkb.native.protocol import join_parts

        backlog = [m for m in self.others if m.get("id") == request_id]
        self.others[:] = [m for m in self.others if m.get("id") != request_id]
        got: list[dict] = []
        parts: list[dict] = []
        while True:
            msg = backlog.pop(0) if backlog else self.next_message(timeout)
            if msg.get("id") != request_id:
                self.others.append(msg)
                continue
            if msg.get("event") == "part":
                parts.append(msg["data"])
                continue
            if parts:
                key = "result" if "ok" in msg else "data"
                assert msg[key] == {"parts": len(parts)}, msg
                msg = {**msg, key: join_parts(parts), "_parts": len(parts)}
                parts = []
            got.append(msg)
            if "ok" in msg:
                self.others[:0] = backlog  # a second reply for a reused id stays for later
                return got

    def request(self, obj: dict, timeout: float = DEFAULT_WAIT) -> dict:
        """Send one request and return its final reply (events are dropped)."""
        self.send(obj)
        return self.until_reply(obj["id"], timeout)[-1]

    def wait(self, timeout: float = DEFAULT_WAIT) -> int:
        """Close stdin if still open and wait for the exit code."""
        self.close_stdin()
        code = self.proc.wait(timeout=timeout)
        self._reader.join(timeout)
        self._err_reader.join(timeout)
        return code

    def stderr_text(self) -> str:
        return b"".join(self._stderr).decode("utf-8", "replace")

    def __enter__(self) -> HostProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            try:
                self.wait(timeout=DEFAULT_WAIT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


# --- server side: the tiny handler table used by the protocol tests -----------------


def _handlers() -> dict:
    import localkb
    from localkb.errors import KnowledgeBaseNotFound

    def echo(data: dict, ctx: Any) -> dict:
        return data

    def slow(data: dict, ctx: Any) -> dict:
        # Runs `steps` steps (default: effectively forever) and stops only when done or
        # cancelled; waiting on the event keeps it responsive without sleeping blindly.
        steps = int(data.get("steps", 10**9))
        for i in range(steps):
            ctx.check_cancelled()
            ctx.emit("progress", {"step": i + 1, "of": steps})
            ctx.cancelled.wait(float(data.get("pause", 0.01)))
        return {"done": steps}

    def big(data: dict, ctx: Any) -> dict:
        size = int(data.get("size", 3 * 1024 * 1024))
        # Quotes, backslashes, newlines and multi-byte characters all cost more than one
        # byte once escaped, which is what the part splitting has to get right.
        unit = 'ab"c\\d\né€😀'
        return {"blob": (unit * (size // len(unit) + 1))[:size], "n": size}

    def big_event(data: dict, ctx: Any) -> dict:
        size = int(data.get("size", 2 * 1024 * 1024))
        ctx.emit("tokens", {"text": "t€" * (size // 2)})
        return {"sent": size}

    def fail_known(data: dict, ctx: Any) -> dict:
        raise KnowledgeBaseNotFound("no knowledge base 'nope'", detail={"kb": "nope"})

    def fail_bug(data: dict, ctx: Any) -> dict:
        raise ValueError("a bug in a handler")

    def noisy(data: dict, ctx: Any) -> dict:
        print("noise from print")  # the point of this handler: stray stdout output
        os.write(1, b"noise straight to fd 1\n")
        return {"quiet": True}

    def status(data: dict, ctx: Any) -> dict:
        return {"host_version": localkb.__version__, "protocol_version": localkb.PROTOCOL_VERSION}

    return {
        "echo": echo,
        "slow": slow,
        "big": big,
        "big_event": big_event,
        "fail_known": fail_known,
        "fail_bug": fail_bug,
        "noisy": noisy,
        "status": status,
    }


if __name__ == "__main__":
    from localkb.native.host import main

    sys.exit(main(sys.argv[1:], handlers=_handlers()))
