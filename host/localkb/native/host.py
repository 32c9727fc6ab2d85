"""The native-messaging host loop: one long-lived process per browser port.

``serve`` reads frames for the life of the port and hands each request to a small pool
of worker threads, so a long ``source.add`` never blocks ``status`` or ``search``.
Writes to stdout are serialised with one lock and are only ever whole frames.

Exit codes of ``serve`` (and so of ``python -m localkb host``):

    0  the browser closed stdin (clean hang-up), possibly after a truncated last frame
    3  a frame header announced more than 64 MiB: the byte stream can no longer be
       trusted, so the host sends one error (id null, reason ``frame_too_large``),
       lets running requests finish, and exits rather than guess where the next frame
       starts. The browser sees the port disconnect either way; the distinct code makes
       the log and the tests say why.

The built-in ``cancel`` request (``{"target": <id>}``) is answered on the reading
thread, never queued behind the work it is meant to stop; it sets the target's
``Context.cancelled`` and replies ``{"cancelled": true|false}``.
"""

from __future__ import annotations

import contextlib
import logging
import logging.handlers
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO

from localkb import PROTOCOL_VERSION, __version__
from localkb.config import Settings
from localkb.errors import Cancelled, HostBusy, LocalKBError, ProtocolError
from localkb.inputs import check_value
from localkb.native import protocol
from localkb.perms import private_dir, private_umask, tighten
from localkb.redact import redact

EXIT_OK = 0
EXIT_UNTRUSTED = 3

DEFAULT_WORKERS = 4
#: Requests accepted but not started yet, and what they hold once parsed (``Request.cost``:
#: their text plus 64 bytes a value): past either, a new request is answered ``host_busy``
#: at once (the reader never blocks: a ``cancel`` must always get through).
MAX_QUEUED = 256
MAX_QUEUED_BYTES = 256 * 1024 * 1024
#: Requests whose frame is bigger than this (a page of many MiB, an upload part) run one at a
#: time, so four workers never extract four 64 MiB pages at once.
BIG_REQUEST = 8 * 1024 * 1024
# How long a hang-up waits for requests already accepted; past this they are cancelled
# (cooperatively) and the process may exit under them, as the workers are daemons.
DEFAULT_DRAIN_SECONDS = 30.0
CANCEL_GRACE_SECONDS = 2.0

LOGGER_NAME = "localkb"


class Context:
    """What a handler gets besides its data: its request id, events, and cancellation."""

    def __init__(self, request_id: str | int, send: Callable[[list[bytes]], None],
                 size: int = 0) -> None:
        self.id = request_id
        self.cancelled = threading.Event()
        self.size = size  # bytes of the request's frame
        self._send = send

    def emit(self, event: str, data: Mapping[str, Any]) -> None:
        """Send an event for this request before its reply; large data goes as parts."""
        self._send(protocol.event_frames(self.id, event, data))

    def check_cancelled(self) -> None:
        """Raise ``Cancelled`` if a ``cancel`` request named this one."""
        if self.cancelled.is_set():
            raise Cancelled(f"request {self.id!r} was cancelled")


Handler = Callable[[dict, Context], dict]


class _Session:
    """State of one port: the writer lock, the requests in flight, the worker pool."""

    def __init__(
        self,
        stdout: BinaryIO,
        handlers: Mapping[str, Handler],
        log: logging.Logger,
        workers: int,
    ) -> None:
        self._out = stdout
        self._write_lock = threading.Lock()
        self._broken = False
        self._handlers = handlers
        self._log = log
        self._state = threading.Condition()
        self._inflight: dict[str | int, Context] = {}  # accepted, queued or running
        self._queued = 0
        self._queued_bytes = 0
        self._big = threading.Semaphore(1)
        self._queue: queue.SimpleQueue[tuple[protocol.Request, Context] | None] = queue.SimpleQueue()
        self._threads = [
            # Daemons: a handler that ignores cancellation must not keep the process
            # alive after the port is gone and the drain period is over.
            threading.Thread(target=self._work, name=f"localkb-worker-{i}", daemon=True)
            for i in range(workers)
        ]
        for thread in self._threads:
            thread.start()

    # -- output --

    def send(self, frames: list[bytes]) -> None:
        # One lock around all frames of a message keeps parts contiguous and frames whole.
        with self._write_lock:
            if self._broken:
                return
            try:
                for frame in frames:
                    self._out.write(frame)
                self._out.flush()
            except (BrokenPipeError, OSError, ValueError) as err:
                # The browser has gone; the reader will see EOF. Drop further output.
                self._broken = True
                self._log.warning("stdout closed, dropping output: %s", err)

    def send_error(self, request_id: Any, code: str, message: str, detail: Mapping | None = None) -> None:
        self.send([protocol.error_frame(request_id, code, message, detail)])

    # -- dispatch --

    def accept(self, request: protocol.Request, size: int = 0) -> None:
        if request.type == "cancel":
            self._cancel(request)
            return
        if request.type not in self._handlers:
            self.send_error(request.id, protocol.UNKNOWN_TYPE, f"unknown message type {request.type!r}")
            return
        busy = None
        with self._state:
            if request.id in self._inflight:
                duplicate = True
            elif self._queued >= MAX_QUEUED or self._queued_bytes + size > MAX_QUEUED_BYTES:
                duplicate = False
                busy = (self._queued, self._queued_bytes)
            else:
                duplicate = False
                ctx = Context(request.id, self.send, size)
                self._inflight[request.id] = ctx
                self._queued += 1
                self._queued_bytes += size
        if busy is not None:
            self._log.warning("busy: refused %s %r (%d queued, %d bytes)", request.type, request.id,
                              *busy)
            self.send_error(request.id, HostBusy.code,
                            f"the host is busy: {busy[0]} requests ({busy[1]:,} bytes) are waiting; "
                            "retry when some have finished",
                            {"limit": "queue", "max_requests": MAX_QUEUED,
                             "max_bytes": MAX_QUEUED_BYTES})
            return
        if duplicate:
            # Two live requests with one id would make cancel and the replies ambiguous.
            self.send_error(
                request.id,
                ProtocolError.code,
                f"request id {request.id!r} is already in flight",
                {"reason": "duplicate_id"},
            )
            return
        self._queue.put((request, ctx))

    def _cancel(self, request: protocol.Request) -> None:
        target = request.data.get("target")
        if isinstance(target, bool) or not isinstance(target, str | int):
            self.send_error(
                request.id,
                ProtocolError.code,
                "cancel needs data.target, the id of a request",
                {"reason": "invalid_data"},
            )
            return
        with self._state:
            ctx = self._inflight.get(target)
            if ctx is not None:
                ctx.cancelled.set()
        self._log.info("cancel %r: %s", target, "signalled" if ctx else "not in flight")
        self.send(protocol.reply_frames(request.id, {"cancelled": ctx is not None}))

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            request, ctx = item
            try:
                self._run(request, ctx)
            finally:
                with self._state:
                    self._inflight.pop(request.id, None)
                    self._state.notify_all()

    def _run(self, request: protocol.Request, ctx: Context) -> None:
        with self._state:
            self._queued -= 1
            self._queued_bytes -= ctx.size
        if ctx.size > BIG_REQUEST:
            with self._big:
                self._handle(request, ctx)
        else:
            self._handle(request, ctx)

    def _handle(self, request: protocol.Request, ctx: Context) -> None:
        handler = self._handlers[request.type]
        try:
            # Cancelled while still queued: never start it.
            ctx.check_cancelled()
            # Every string and number of every message is checked here, once, so no handler
            # meets a lone surrogate, a NUL or a NaN (in the worker: a 64 MiB page costs a scan).
            check_value(request.data, "data")
            result = handler(request.data, ctx)
            if not isinstance(result, dict):
                raise TypeError(f"handler for {request.type!r} returned {type(result).__name__}, not dict")
            frames = protocol.reply_frames(request.id, result)
        except LocalKBError as err:
            self._log.info("%s %r failed: %s: %s", request.type, request.id, err.code, err)
            self.send_error(request.id, err.code, err.message, err.detail)
            return
        except Exception:
            # A bug in a handler must cost one request, never the host.
            self._log.exception("%s %r raised", request.type, request.id)
            self.send_error(request.id, protocol.INTERNAL_ERROR, f"internal error in {request.type!r}")
            return
        self.send(frames)

    # -- shutdown --

    def drain(self, timeout: float) -> None:
        """Let accepted requests finish; after ``timeout`` cancel them and stop waiting."""
        deadline = time.monotonic() + timeout
        with self._state:
            while self._inflight and (left := deadline - time.monotonic()) > 0:
                self._state.wait(left)
            if self._inflight:
                ids = list(self._inflight)
                self._log.warning("hang-up: cancelling %d unfinished request(s) %r", len(ids), ids)
                for ctx in self._inflight.values():
                    ctx.cancelled.set()
                grace = time.monotonic() + CANCEL_GRACE_SECONDS
                while self._inflight and (left := grace - time.monotonic()) > 0:
                    self._state.wait(left)
        for _ in self._threads:
            self._queue.put(None)

    def close(self) -> None:
        """Drop any later output: a worker outliving the drain must not touch a closed stdout."""
        with self._write_lock:
            self._broken = True


def serve(
    stdin_binary: BinaryIO,
    stdout_binary: BinaryIO,
    handlers: Mapping[str, Handler],
    *,
    log: logging.Logger,
    workers: int = DEFAULT_WORKERS,
    drain_seconds: float = DEFAULT_DRAIN_SECONDS,
) -> int:
    """Serve requests from ``stdin_binary`` until EOF; return the exit code (see module doc)."""
    session = _Session(stdout_binary, handlers, log, workers)
    code = EXIT_OK
    log.info("host %s (protocol %d) serving %d handler(s)", __version__, PROTOCOL_VERSION, len(handlers))
    while True:
        try:
            body = protocol.read_frame(stdin_binary)
        except protocol.UntrustedLength as err:
            log.error("closing the port: %s", err)
            session.send_error(None, err.code, err.message, err.detail)
            code = EXIT_UNTRUSTED
            break
        except ProtocolError as err:
            # Only truncation gets here, and truncation means the stream has ended.
            log.warning("%s", err)
            session.send_error(None, err.code, err.message, err.detail)
            continue
        except OSError as err:
            log.warning("stdin failed, treating as hang-up: %s", err)
            break
        if body is None:
            log.info("stdin closed")
            break
        try:
            request = protocol.decode_request(body)
            session.accept(request, request.cost)
        except protocol.RequestError as err:
            log.info("bad request (%d bytes): %s", len(body), err.reason)
            session.send_error(err.request_id, err.code, err.message, err.detail)
        except LocalKBError as err:  # nesting too deep to read: named, but the id is unknown
            log.info("bad request (%d bytes): %s", len(body), err)
            session.send_error(None, err.code, err.message, err.detail)
        except Exception:
            # Whatever input found a gap in validation costs one reply, not the port.
            log.exception("unexpected failure reading a %d-byte request", len(body))
            session.send_error(None, protocol.INTERNAL_ERROR, "internal error reading a request")
    session.drain(drain_seconds)
    session.close()
    log.info("host exiting with %d", code)
    return code


class _RedactingFormatter(logging.Formatter):
    """Log lines (tracebacks included) with bearer tokens and ``sk-`` keys masked."""

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


def setup_logging(data_dir: Path) -> logging.Logger:
    """Log to ``<data_dir>/logs/host.log`` (rotated) and to stderr; return the logger."""
    logger = logging.getLogger(LOGGER_NAME)
    logger.setLevel(logging.INFO)
    fmt = _RedactingFormatter("%(asctime)s %(process)d %(threadName)s %(levelname)s %(message)s")
    log_file = (Path(data_dir) / "logs" / "host.log").resolve()
    have = {getattr(h, "baseFilename", None) for h in logger.handlers}
    file_problem = None
    if str(log_file) not in have:
        try:
            private_dir(log_file.parent)
            file_handler = logging.handlers.RotatingFileHandler(
                log_file, maxBytes=2 * 1024 * 1024, backupCount=3, encoding="utf-8"
            )
        except OSError as err:
            # An unwritable data dir must not stop the host: status reports it later.
            file_problem = err
        else:
            file_handler.setFormatter(fmt)
            logger.addHandler(file_handler)
    if not any(getattr(h, "_localkb_stderr", False) for h in logger.handlers):
        stderr_handler = logging.StreamHandler(sys.stderr)
        stderr_handler._localkb_stderr = True  # type: ignore[attr-defined]
        stderr_handler.setFormatter(fmt)
        logger.addHandler(stderr_handler)
    if file_problem is not None:
        logger.warning("no log file at %s: %s", log_file, file_problem)
    return logger


def _fallback_status(data: dict, ctx: Context) -> dict:
    return {
        "host_version": __version__,
        "protocol_version": PROTOCOL_VERSION,
        "ready": False,
        "problem": "handlers unavailable; see the host log",
    }


def _default_handlers(log: logging.Logger) -> Mapping[str, Handler]:
    try:
        from localkb.native import handlers as handlers_module

        return handlers_module.HANDLERS
    except Exception:
        # status must answer even when the core cannot load (STYLE 5).
        log.exception("could not load localkb.native.handlers; serving status only")
        return {"status": _fallback_status}


def main(argv: Sequence[str] | None = None, *, handlers: Mapping[str, Handler] | None = None) -> int:
    """Run the host on this process's stdio; ``argv`` is what the browser passed (logged only).

    Chrome passes the caller's origin (and ``--parent-window=`` on Windows), Firefox the
    manifest path and the extension id; none of it changes behaviour.
    """
    # Claim the real stdout for frames, then point fd 1 (and sys.stdout) at stderr so a
    # stray print from any library, Python or C, can never corrupt the frame stream.
    frames_out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    private_umask()  # every file this process creates is the user's alone (0600 / 0700)
    data_dir = Settings.from_env().data_dir
    log = setup_logging(data_dir)
    log.info("started by %r", list(argv or []))
    tighten(data_dir)
    table = handlers if handlers is not None else _default_handlers(log)
    try:
        return serve(sys.stdin.buffer, frames_out, table, log=log)
    finally:
        with contextlib.suppress(OSError):
            frames_out.close()
