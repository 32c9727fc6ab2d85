"""A real HTTP server on 127.0.0.1 that speaks the OpenAI chat-completions streaming protocol.

It stands in for the one thing tests cannot run here, a cloud (or local) model, and lets tests
see exactly what was sent to it::

    with FakeLLM(mode="crlf", reply="Paris is the capital.") as llm:
        endpoint = Endpoint("fake", llm.base_url, "fake-model")
        assert complete(endpoint, [{"role": "user", "content": "?"}]) == "Paris is the capital."
        assert llm.requests[0]["messages"][0]["content"] == "?"

Modes:
    lf              normal stream, events separated by ``\\n\\n``
    crlf            the same with ``\\r\\n`` line endings (events split mid-line-ending too)
    cr              the same with bare ``\\r`` line endings
    slow            ``lf`` with ``delay`` seconds between chunks
    fail_midstream  sends ``cut_after`` tokens, then drops the connection (chunked body unfinished)
    no_done         sends ``cut_after`` tokens, then ends the body cleanly without [DONE]
    bad_json        sends ``cut_after`` tokens, then an event that is not JSON
    hang            accepts, sends the response headers, then never sends a byte
    http_error      answers ``status`` (500) with an OpenAI-style JSON error body (its message is
                    ``error_message``, or ``error_message(request_headers)`` when callable)
    error_event     answers 200 and streams an ``{"error": ...}`` event (as vLLM/OpenRouter do)
    json_only       ignores ``"stream": true`` and answers one JSON completion

``reply_fn(request_json) -> str`` scripts the reply from the request. ``GET /v1/models`` lists
the model. Exiting the context manager stops every handler (even a hanging one) and closes
the socket.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODES = (
    "lf",
    "crlf",
    "cr",
    "slow",
    "fail_midstream",
    "no_done",
    "bad_json",
    "hang",
    "http_error",
    "error_event",
    "json_only",
)


def split_tokens(text: str) -> list[str]:
    """Split a reply into word-sized deltas whose concatenation is exactly ``text``."""
    return re.findall(r"\s+|\S+\s*", text)


class _Server(ThreadingHTTPServer):
    # Handlers are joined on close, so a test never leaves a thread writing behind it.
    daemon_threads = False
    block_on_close = True
    fake: FakeLLM


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server
    # A client that connects and sends nothing must not hold a handler (and shutdown) forever.
    timeout = 30

    def log_message(self, format: str, *args: Any) -> None:
        """Keep test output clean."""

    # ------------------------------------------------------------------ plumbing

    def _send_json(self, status: int, obj: Any) -> None:
        body = json.dumps(obj).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = True

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    # ------------------------------------------------------------------ routes

    def do_GET(self) -> None:
        fake = self.server.fake
        if self.path.rstrip("/") == "/v1/models":
            self._send_json(
                200,
                {
                    "object": "list",
                    "data": [{"id": fake.model, "object": "model", "owned_by": "fakellm"}],
                },
            )
        else:
            self._send_json(404, {"error": {"message": f"no route {self.path}"}})

    def do_POST(self) -> None:
        fake = self.server.fake
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        try:
            body = json.loads(raw)
        except ValueError:
            self._send_json(400, {"error": {"message": "request body is not JSON"}})
            return
        with fake.lock:
            fake.requests.append(body)
            fake.request_headers.append({k.lower(): v for k, v in self.headers.items()})
        if self.path.rstrip("/") != "/v1/chat/completions":
            self._send_json(404, {"error": {"message": f"no route {self.path}"}})
            return
        if fake.mode == "http_error":
            message = fake.error_message
            if callable(message):
                message = message({k.lower(): v for k, v in self.headers.items()})
            self._send_json(fake.status, {"error": {"message": message, "type": "server_error"}})
            return
        reply = fake.reply_fn(body) if fake.reply_fn is not None else fake.reply
        if not body.get("stream") or fake.mode == "json_only":
            self._send_json(200, _completion(fake.model, reply))
            return
        try:
            self._stream(fake, reply)
        except (BrokenPipeError, ConnectionResetError):
            # The client went away (a cancel, a timeout): exactly what some tests wait for.
            fake.client_disconnected.set()
        self.close_connection = True

    def _stream(self, fake: FakeLLM, reply: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.flush()
        if fake.mode == "hang":
            fake.stop.wait()
            return
        sep = {"crlf": "\r\n", "cr": "\r"}.get(fake.mode, "\n")
        tokens = split_tokens(reply)
        cut = fake.cut_after if fake.cut_after is not None else max(1, len(tokens) // 2)
        created = int(time.time())

        def chunk_json(delta: dict, finish: str | None = None) -> str:
            return json.dumps(
                {
                    "id": "chatcmpl-fake",
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": fake.model,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                }
            )

        # A comment first, as proxies do to keep connections open: the client must skip it.
        self._chunk(f": fakellm keep-alive{sep}{sep}".encode())
        self._chunk(f"data: {chunk_json({'role': 'assistant', 'content': ''})}{sep}{sep}".encode())
        for i, token in enumerate(tokens):
            if fake.mode in ("fail_midstream", "no_done", "bad_json", "error_event") and i == cut:
                break
            event = f"data: {chunk_json({'content': token})}{sep}{sep}".encode()
            if sep == "\r\n":
                # Split between \r and \n so a reader that is not careful sees two line ends.
                head, tail = event[:-1], event[-1:]
                self._chunk(head)
                self._chunk(tail)
            else:
                self._chunk(event)
            if fake.mode == "slow" and fake.stop.wait(fake.delay):
                return
        else:
            self._chunk(f"data: {chunk_json({}, 'stop')}{sep}{sep}".encode())
            self._chunk(f"data: [DONE]{sep}{sep}".encode())
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
            return
        if fake.mode == "fail_midstream":
            # No terminating chunk: the body is cut off, as when a proxy or server dies.
            self.wfile.flush()
            return
        if fake.mode == "bad_json":
            self._chunk(f'data: {{"choices": [{{"delta": {{"content": "x"{sep}{sep}'.encode())
        if fake.mode == "error_event":
            error = {"error": {"message": "model overloaded", "code": 503}}
            self._chunk(f"data: {json.dumps(error)}{sep}{sep}".encode())
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


def _completion(model: str, reply: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": reply},
                "finish_reason": "stop",
            }
        ],
    }


class FakeLLM:
    """Context manager running the fake model server; see the module docstring for modes."""

    def __init__(
        self,
        mode: str = "lf",
        reply: str = "This is the fake model's answer.",
        *,
        reply_fn: Callable[[dict[str, Any]], str] | None = None,
        delay: float = 0.05,
        cut_after: int | None = None,
        status: int = 500,
        model: str = "fake-model",
        error_message: str | Callable[[dict[str, str]], str] = "the fake model failed on purpose",
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown FakeLLM mode {mode!r}; one of {', '.join(MODES)}")
        self.mode = mode
        self.reply = reply
        self.reply_fn = reply_fn
        self.delay = delay
        self.cut_after = cut_after
        self.status = status
        self.model = model
        self.error_message = error_message
        self.lock = threading.Lock()
        #: Every JSON body received, in order.
        self.requests: list[dict[str, Any]] = []
        #: The headers of each request (lower-cased names), parallel to ``requests``.
        self.request_headers: list[dict[str, str]] = []
        #: Set when a client hung up while the server was still streaming to it.
        self.client_disconnected = threading.Event()
        self.stop = threading.Event()
        self._server: _Server | None = None
        self._port: int | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        assert self._port is not None, "FakeLLM was never started"
        return self._port

    @property
    def base_url(self) -> str:
        """The API root to configure as an endpoint's ``base_url``."""
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> FakeLLM:
        server = _Server(("127.0.0.1", 0), _Handler)
        server.fake = self
        self._server = server
        self._port = server.server_address[1]
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="fakellm"
        )
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop serving, release hanging handlers, join every thread, close the socket."""
        if self._server is None:
            return
        self.stop.set()
        self._server.shutdown()
        self._server.server_close()  # joins the handler threads (block_on_close)
        assert self._thread is not None
        self._thread.join()
        self._server = None
