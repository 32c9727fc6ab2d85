"""Model endpoints: their configuration and one streaming client for the OpenAI chat API.

Every backend LocalKB talks to (Ollama, llama.cpp server, LM Studio, vLLM, a cloud
provider, a LiteLLM proxy) speaks the OpenAI-compatible ``POST {base_url}/chat/completions``
with ``"stream": true``, answered as server-sent events. So there is one client here, no
per-backend classes.

- ``Endpoint`` / ``LLMConfig`` / ``load_config`` / ``save_config``: the endpoints the user
  configured, kept in ``<data_dir>/config.json`` (mode 0600, rewritten atomically).
- ``iter_sse_events``: a pure server-sent-events parser (bytes in, ``data`` strings out).
- ``stream_chat`` / ``complete`` / ``list_models``: the client. Every failure becomes
  ``LLMUnavailable`` naming the endpoint; ``cancel.set()`` from any thread stops a stream
  promptly and raises ``Cancelled``.

Which knowledge bases may reach which endpoint is decided in ``privacy.py``, not here.
"""

from __future__ import annotations

import codecs
import contextlib
import json
import os
import re
import socket
import tempfile
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpcore
import httpx

from localkb.answer.privacy import Placement, endpoint_target, is_loopback_address, locate
from localkb.errors import Cancelled, InvalidInput, LLMUnavailable, NotFound
from localkb.perms import private_dir
from localkb.redact import redact
from localkb.strings import clean_name

CONFIG_FILE = "config.json"
_CONFIG_MODE = 0o600
# An error body is read only to quote the server's message; a runaway body is not.
_MAX_ERROR_BODY = 64 * 1024
# A non-streamed JSON answer (a server that ignores "stream") is still bounded.
_MAX_JSON_BODY = 8 * 1024 * 1024
# How often the cancel watcher looks at the cancel event; the bound on cancel latency.
_CANCEL_POLL = 0.05
_NAME_RE = re.compile(r"^[^\x00-\x1f]{1,100}$")
#: The only environment variables an endpoint may read its key from: ones named for holding a
#: key (``OPENAI_API_KEY``, ``HF_TOKEN``). Any other name (``HOME``, ``AWS_SECRET_ACCESS_KEY``,
#: ``LOCALKB_PASSPHRASE``) is refused, so a configuration cannot send an unrelated secret.
KEY_ENV_PATTERN = re.compile(r"[A-Z][A-Z0-9_]{0,126}(?:_API_KEY|_TOKEN)")


def key_env_allowed(name: object) -> bool:
    """Whether ``name`` is a variable an endpoint may read its key from."""
    return isinstance(name, str) and KEY_ENV_PATTERN.fullmatch(name) is not None


def check_base_url(name: str, url: str) -> None:
    """``InvalidInput`` unless ``url`` is an http(s) URL with a host the client can connect to."""
    problem = endpoint_target(url)
    if isinstance(problem, str):
        raise InvalidInput(f"endpoint {name!r}: base_url {url!r}: {problem} (it must look like "
                           "http://127.0.0.1:11434/v1)", detail={"field": "base_url"})


# --------------------------------------------------------------------------- endpoints


@dataclass(frozen=True)
class Endpoint:
    """One OpenAI-compatible model endpoint.

    ``base_url`` is the API root (``http://127.0.0.1:11434/v1``); ``model`` the model name sent
    in each request. The key comes from the environment variable ``api_key_env`` when that is
    set and non-empty, else from ``api_key``. ``mark_cloud`` says that a loopback endpoint
    forwards to a cloud model (a LiteLLM or OpenRouter proxy), so it is treated as cloud.
    """

    name: str
    base_url: str
    model: str
    api_key_env: str | None = None
    # repr=False: a stored key must never end up in a log line or a traceback.
    api_key: str | None = field(default=None, repr=False)
    mark_cloud: bool = False

    def resolve_api_key(self, environ: Mapping[str, str] | None = None) -> str | None:
        """The key to send: the variable named by ``api_key_env`` if set, else the stored key.

        A variable whose name is not a key variable's (see ``KEY_ENV_PATTERN``) is never read,
        even if an older configuration names it.
        """
        env = os.environ if environ is None else environ
        if self.api_key_env and key_env_allowed(self.api_key_env):
            value = env.get(self.api_key_env)
            if value:
                return value
        return self.api_key or None

    def public_dict(self) -> dict[str, Any]:
        """The endpoint as shown to the user and the extension: never the key itself."""
        return {
            "name": self.name,
            "base_url": display_url(self.base_url),
            "model": self.model,
            "api_key_env": self.api_key_env,
            "api_key_set": self.resolve_api_key() is not None,
            "mark_cloud": self.mark_cloud,
            "location": locate(self).location,
        }

    def to_dict(self) -> dict[str, Any]:
        """The endpoint as stored in config.json (with the stored key, if any)."""
        return {
            "name": self.name,
            "base_url": self.base_url,
            "model": self.model,
            "api_key_env": self.api_key_env,
            "api_key": self.api_key,
            "mark_cloud": self.mark_cloud,
        }

    @classmethod
    def from_dict(cls, data: Any, *, stored: bool = False) -> Endpoint:
        """Build an endpoint from untrusted JSON; ``InvalidInput`` names the bad field.

        ``stored``: read from config.json, where an older version may have kept what is refused
        today (a variable that is not a key variable); it loads, and is never used.
        """
        if not isinstance(data, Mapping):
            raise InvalidInput("an endpoint must be a JSON object")
        name = data.get("name")
        if not isinstance(name, str) or not _NAME_RE.match(name) or not name.strip():
            raise InvalidInput(f"endpoint name must be 1-100 printable characters, got {name!r}")
        if not stored:
            name = clean_name(name, what="an endpoint name", max_len=100)
        base_url = data.get("base_url")
        if not isinstance(base_url, str) or not base_url.strip():
            raise InvalidInput(f"endpoint {name!r}: base_url must be a non-empty string")
        model = data.get("model")
        if not isinstance(model, str) or not model.strip():
            raise InvalidInput(f"endpoint {name!r}: model must be a non-empty string")
        api_key_env = data.get("api_key_env")
        if api_key_env is not None and (not isinstance(api_key_env, str) or not api_key_env):
            raise InvalidInput(f"endpoint {name!r}: api_key_env must be a variable name or null")
        if api_key_env is not None and not stored and not key_env_allowed(api_key_env):
            raise InvalidInput(
                f"endpoint {name!r}: api_key_env {api_key_env!r} is not a key variable: name one "
                "you set for the key, in capitals, ending in _API_KEY or _TOKEN "
                "(e.g. OPENAI_API_KEY)", detail={"field": "api_key_env"})
        api_key = data.get("api_key")
        if api_key is not None and not isinstance(api_key, str):
            raise InvalidInput(f"endpoint {name!r}: api_key must be a string or null")
        mark_cloud = data.get("mark_cloud", False)
        if not isinstance(mark_cloud, bool):
            raise InvalidInput(f"endpoint {name!r}: mark_cloud must be true or false")
        return cls(
            name=name,
            base_url=base_url.strip(),
            model=model.strip(),
            api_key_env=api_key_env,
            api_key=api_key or None,
            mark_cloud=mark_cloud,
        )


@dataclass(frozen=True)
class LLMConfig:
    """The configured endpoints and which one answers by default (``None``: extractive answers)."""

    endpoints: tuple[Endpoint, ...] = ()
    default_endpoint: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "endpoints", tuple(self.endpoints))
        names = [e.name for e in self.endpoints]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise InvalidInput(f"endpoint names must be unique, repeated: {', '.join(dupes)}")
        if self.default_endpoint is not None and self.default_endpoint not in names:
            raise InvalidInput(f"default endpoint {self.default_endpoint!r} is not configured")

    @property
    def default(self) -> Endpoint | None:
        """The default endpoint, or ``None`` when answers are extractive."""
        if self.default_endpoint is None:
            return None
        return self.get(self.default_endpoint)

    def get(self, name: str) -> Endpoint:
        """The endpoint called ``name``; ``NotFound`` when there is none."""
        for endpoint in self.endpoints:
            if endpoint.name == name:
                return endpoint
        known = ", ".join(e.name for e in self.endpoints) or "none"
        raise NotFound(f"no model endpoint named {name!r} (configured: {known})")

    def public_dict(self) -> dict[str, Any]:
        """The configuration as shown to the user: keys omitted."""
        return {
            "endpoints": [e.public_dict() for e in self.endpoints],
            "default_endpoint": self.default_endpoint,
        }


def merge_endpoint(old: LLMConfig, given: Mapping[str, Any]) -> tuple[Endpoint, str | None]:
    """The endpoint as given, and a note when a stored key was dropped.

    A stored key is bound to the base URL it was given for: an endpoint sent without
    ``api_key`` keeps the key stored under its name only while its base URL is unchanged, so
    editing the URL of "openai" never sends its key to the new host.
    """
    if not isinstance(given, Mapping):
        raise InvalidInput("each endpoint must be an object", detail={"field": "endpoints"})
    raw = dict(given)
    note = None
    if "api_key" not in raw:
        prev = next((e for e in old.endpoints if e.name == raw.get("name")), None)
        url = raw.get("base_url")
        same = prev is not None and isinstance(url, str) and prev.base_url == url.strip()
        raw["api_key"] = prev.api_key if same else None
        if prev is not None and prev.api_key and not same:
            note = (f"the stored API key of {prev.name!r} was dropped: it was given for "
                    f"{display_url(prev.base_url)}, not for the new URL; give it again")
    return Endpoint.from_dict(raw), note


def _read_config_json(path: Path) -> dict[str, Any]:
    try:
        raw = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except OSError as err:
        raise InvalidInput(f"cannot read {path}: {err.strerror}") from err
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as err:
        raise InvalidInput(f"{path} is not valid JSON: {err}") from err
    if not isinstance(data, dict):
        raise InvalidInput(f"{path} must hold a JSON object")
    return data


def load_config(data_dir: Path) -> LLMConfig:
    """Read the endpoints from ``<data_dir>/config.json``; a missing file means none configured."""
    path = Path(data_dir) / CONFIG_FILE
    data = _read_config_json(path)
    raw_endpoints = data.get("endpoints", [])
    if not isinstance(raw_endpoints, list):
        raise InvalidInput(f"{path}: 'endpoints' must be a list")
    default = data.get("default_endpoint")
    if default is not None and not isinstance(default, str):
        raise InvalidInput(f"{path}: 'default_endpoint' must be a name or null")
    return LLMConfig(
        endpoints=tuple(Endpoint.from_dict(e, stored=True) for e in raw_endpoints),
        default_endpoint=default,
    )


def save_config(data_dir: Path, config: LLMConfig) -> None:
    """Write the endpoints into ``<data_dir>/config.json``: 0600, temp file + rename.

    Every endpoint that is new or whose URL changed must have a URL the client can connect to
    (``InvalidInput`` otherwise, and nothing is written); one stored before URLs were checked
    is kept as it was. Other top-level keys of the file (settings owned by other parts of the
    host) are kept.
    """
    directory = private_dir(Path(data_dir))
    path = directory / CONFIG_FILE
    data = _read_config_json(path)
    before = {(e.get("name"), e.get("base_url")) for e in data.get("endpoints") or []
              if isinstance(e, dict)}
    for endpoint in config.endpoints:
        if (endpoint.name, endpoint.base_url) not in before:
            check_base_url(endpoint.name, endpoint.base_url)
    data["endpoints"] = [e.to_dict() for e in config.endpoints]
    data["default_endpoint"] = config.default_endpoint
    payload = json.dumps(data, indent=2, ensure_ascii=False).encode("utf-8") + b"\n"
    # mkstemp creates the file 0600 from the start, so the key is never readable by others,
    # not even for the moment between write and chmod.
    fd, tmp_name = tempfile.mkstemp(prefix=".config.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), _CONFIG_MODE)
            fh.write(payload)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise


# --------------------------------------------------------------------------- SSE parsing


def iter_sse_events(byte_chunks: Iterable[bytes]) -> Iterator[str]:
    """Yield the ``data`` of each server-sent event in a byte stream, as the WHATWG spec reads it.

    Lines end in ``\\r\\n``, ``\\n`` or ``\\r`` (a ``\\r\\n`` split across two chunks is one line
    ending); a blank line dispatches the event; ``:`` lines are comments; several ``data:``
    lines join with ``\\n``; one space after the colon is dropped; other fields are ignored;
    an event without data is not dispatched; an unfinished event at the end is discarded.
    ``[DONE]`` is yielded like any data: ending the stream is the caller's decision.
    """
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    buffer = ""
    data_lines: list[str] = []
    at_start = True

    def take_lines(final: bool) -> Iterator[str]:
        nonlocal buffer
        start = 0
        length = len(buffer)
        while start < length:
            cr = buffer.find("\r", start)
            lf = buffer.find("\n", start)
            if cr == -1 and lf == -1:
                break
            if cr != -1 and (lf == -1 or cr < lf):
                if cr + 1 == length and not final:
                    # A trailing \r may be the first half of \r\n: wait for the next chunk.
                    break
                end, next_start = cr, cr + 2 if buffer.startswith("\n", cr + 1) else cr + 1
            else:
                end, next_start = lf, lf + 1
            yield buffer[start:end]
            start = next_start
        buffer = buffer[start:]

    def feed(text: str, final: bool) -> Iterator[str]:
        nonlocal buffer, data_lines
        buffer += text
        for line in take_lines(final):
            if line == "":
                if data_lines:
                    yield "\n".join(data_lines)
                data_lines = []
                continue
            if line.startswith(":"):
                continue
            name, colon, value = line.partition(":")
            if colon and value.startswith(" "):
                value = value[1:]
            if name == "data":
                data_lines.append(value)

    for chunk in byte_chunks:
        if not chunk:
            continue
        text = decoder.decode(chunk)
        if at_start and text:
            text = text.removeprefix("\ufeff")
            at_start = False
        yield from feed(text, final=False)
    tail = decoder.decode(b"", final=True)
    yield from feed(tail, final=True)


# --------------------------------------------------------------------------- the client


@dataclass(frozen=True)
class Timeouts:
    """Seconds to wait to connect, and between two reads of an answer (not for the whole answer)."""

    connect: float = 5.0
    read: float = 60.0

    def to_httpx(self) -> httpx.Timeout:
        """The same limits as httpx wants them (writing the request shares the connect limit)."""
        return httpx.Timeout(
            connect=self.connect, read=self.read, write=self.connect, pool=self.connect
        )


DEFAULT_TIMEOUTS = Timeouts()


def display_url(url: str) -> str:
    """The URL with any ``user:password@`` removed, for messages and the UI."""
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError, ValueError):
        return url if "@" not in url else "<unparsable URL>"
    if parsed.userinfo:
        return str(parsed.copy_with(username=None, password=None))
    return url


def _where(endpoint: Endpoint) -> str:
    return f"model endpoint {endpoint.name!r} ({display_url(endpoint.base_url)})"


def _unavailable(endpoint: Endpoint, what: str, reason: str, **extra: Any) -> LLMUnavailable:
    # Everything here may quote the server (an error body, a redirect target), and a server may
    # echo the key it was sent: redacted before it can reach a log, the catalogue or a reply.
    secrets = (endpoint.api_key, endpoint.resolve_api_key())
    detail = {
        "endpoint": endpoint.name,
        "base_url": display_url(endpoint.base_url),
        "reason": reason,
        **{k: redact(v, secrets) if isinstance(v, str) else v for k, v in extra.items()},
    }
    return LLMUnavailable(redact(f"{_where(endpoint)}: {what}", secrets), detail=detail)


def _api_url(endpoint: Endpoint, path: str) -> httpx.URL:
    problem = endpoint_target(endpoint.base_url)
    if isinstance(problem, str):
        raise _unavailable(endpoint, f"invalid base URL: {problem}", "invalid_url")
    try:
        return httpx.URL(endpoint.base_url.strip().rstrip("/") + "/" + path)
    except Exception as err:
        raise _unavailable(endpoint, f"invalid base URL: {err}", "invalid_url") from err


class _PinnedBackend(httpcore.SyncBackend):
    """Connects only to the addresses a device verdict was decided on, never by resolving again.

    The URL's host still goes in the Host header and in TLS's SNI (httpcore takes both from the
    URL, not from the socket), so a server behind a name answers as it would by that name.
    """

    def __init__(self, placement: Placement) -> None:
        self._placement = placement

    def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                    local_address: str | None = None,
                    socket_options: Iterable[Any] | None = None) -> httpcore.NetworkStream:
        where = self._placement
        if (host, port) != (where.host, where.port):
            raise httpcore.ConnectError(f"refused: {host}:{port} is not the endpoint that was checked")
        last: Exception = httpcore.ConnectError(f"refused: {host} has no checked address")
        for address in where.addresses:
            if not is_loopback_address(address):
                raise httpcore.ConnectError(f"refused: {address} is not a loopback address")
            try:
                return super().connect_tcp(address, port, timeout, local_address, socket_options)
            except httpcore.ConnectError as err:
                last = err
        raise last


def _client(endpoint: Endpoint, timeout: Timeouts, placement: Placement) -> httpx.Client:
    # A proxy from HTTP_PROXY/ALL_PROXY would carry an on-device prompt off the machine, so
    # on-device endpoints ignore the environment and connect only to the checked loopback
    # addresses; cloud ones honour it (corporate proxies).
    # Redirects are never followed: a 3xx could lead a loopback request anywhere.
    if placement.on_device:
        transport = httpx.HTTPTransport(trust_env=False)
        # The same pool httpx builds, with the one difference that matters here.
        transport._pool = httpcore.ConnectionPool(
            ssl_context=httpx.create_ssl_context(trust_env=False),
            network_backend=_PinnedBackend(placement))
        return httpx.Client(timeout=timeout.to_httpx(), trust_env=False, follow_redirects=False,
                            transport=transport)
    return httpx.Client(timeout=timeout.to_httpx(), trust_env=True, follow_redirects=False)


def _headers(endpoint: Endpoint) -> dict[str, str]:
    headers = {"Accept": "text/event-stream, application/json"}
    key = endpoint.resolve_api_key()
    if key:
        headers["Authorization"] = f"Bearer {key}"
    return headers


def _map_transport_error(endpoint: Endpoint, err: Exception, timeout: Timeouts) -> LLMUnavailable:
    if isinstance(err, httpx.ConnectTimeout):
        return _unavailable(endpoint, f"no connection within {timeout.connect:g} s", "timeout")
    if isinstance(err, httpx.TimeoutException):
        return _unavailable(endpoint, f"no data for {timeout.read:g} s (read timeout)", "timeout")
    if isinstance(err, httpx.ConnectError):
        return _unavailable(
            endpoint, f"cannot connect ({err}); is the server running?", "unreachable"
        )
    if isinstance(err, httpx.RemoteProtocolError):
        return _unavailable(
            endpoint, f"connection closed before the answer was complete ({err})", "incomplete"
        )
    if isinstance(err, httpx.NetworkError):
        return _unavailable(endpoint, f"network error ({err})", "network")
    if isinstance(err, httpx.UnsupportedProtocol):
        return _unavailable(endpoint, f"invalid base URL ({err})", "invalid_url")
    return _unavailable(endpoint, f"{type(err).__name__}: {err}", "http_error")


def _read_capped(response: httpx.Response, cap: int) -> bytes:
    body = bytearray()
    for chunk in response.iter_bytes():
        body += chunk
        if len(body) > cap:
            break
    return bytes(body[:cap])


def _error_message(body: bytes) -> str:
    """The server's own words from an error body (OpenAI ``{"error": {"message"}}`` or text)."""
    text = body.decode("utf-8", errors="replace").strip()
    try:
        data = json.loads(text)
    except ValueError:
        return text[:300]
    if isinstance(data, dict):
        err = data.get("error", data)
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return err["message"][:300]
        if isinstance(err, str):
            return err[:300]
    return text[:300]


def _check_status(endpoint: Endpoint, response: httpx.Response) -> None:
    status = response.status_code
    if 200 <= status < 300:
        return
    if 300 <= status < 400:
        target = response.headers.get("location", "?")
        raise _unavailable(
            endpoint,
            f"HTTP {status} redirect to {target!r} (redirects are not followed)",
            "http_status",
            status=status,
        )
    message = _error_message(_read_capped(response, _MAX_ERROR_BODY))
    hint = ""
    if status in (401, 403) and endpoint.resolve_api_key() is None:
        hint = (
            f"; no API key is set (environment variable {endpoint.api_key_env} is empty)"
            if endpoint.api_key_env
            else "; no API key is set"
        )
    raise _unavailable(
        endpoint,
        f"HTTP {status}: {message or response.reason_phrase}{hint}",
        "http_status",
        status=status,
    )


def _parse_json(endpoint: Endpoint, data: str) -> dict[str, Any]:
    try:
        obj = json.loads(data)
    except ValueError as err:
        raise _unavailable(
            endpoint, f"malformed JSON in the answer stream: {data[:80]!r}", "malformed"
        ) from err
    if not isinstance(obj, dict):
        raise _unavailable(
            endpoint, f"unexpected event in the answer stream: {data[:80]!r}", "malformed"
        )
    if "error" in obj:
        message = _error_message(data.encode())
        raise _unavailable(endpoint, f"the server reported an error: {message}", "error_event")
    return obj


def _first_choice(endpoint: Endpoint, obj: dict[str, Any]) -> dict[str, Any] | None:
    choices = obj.get("choices")
    if choices is None or choices == []:
        # Usage-only chunks (stream_options.include_usage) carry no choice.
        return None
    if not isinstance(choices, list) or not isinstance(choices[0], dict):
        raise _unavailable(endpoint, "malformed 'choices' in the answer", "malformed")
    return choices[0]


class _CancelWatch:
    """Closes the connection's socket from a helper thread once ``cancel`` is set.

    A read blocked in ``recv`` does not notice ``cancel`` until the server sends something (a
    hung server: never). Shutting the socket down wakes it at once; the stream then ends in an
    error that the client turns into ``Cancelled``. httpcore's ``trace`` extension hands us
    the socket as soon as it is connected, so a cancel while waiting for headers works too.
    """

    def __init__(self, cancel: threading.Event) -> None:
        self._cancel = cancel
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._shut = False
        self._finished = threading.Event()
        self._thread = threading.Thread(target=self._run, name="localkb-llm-cancel", daemon=True)

    def trace(self, event: str, info: dict[str, Any]) -> None:
        if event.endswith((".connect_tcp.complete", ".start_tls.complete")):
            stream = info.get("return_value")
            sock = stream.get_extra_info("socket") if stream is not None else None
            if isinstance(sock, socket.socket):
                with self._lock:
                    self._sock = sock
                if self._cancel.is_set():
                    self._shutdown()

    def _shutdown(self) -> None:
        with self._lock:
            sock = self._sock
            if sock is None or self._shut or self._finished.is_set():
                return
            self._shut = True
            # socket.socket.shutdown, not SSLSocket.shutdown: the latter also drops the TLS
            # object that the reading thread is using.
            with contextlib.suppress(OSError):
                socket.socket.shutdown(sock, socket.SHUT_RDWR)

    def _run(self) -> None:
        while not self._finished.is_set():
            if self._cancel.wait(_CANCEL_POLL):
                self._shutdown()
                if self._shut:
                    return
                self._finished.wait(_CANCEL_POLL)

    def __enter__(self) -> _CancelWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            # From here the socket may be closed and its number reused: never touch it again.
            self._finished.set()
            self._sock = None
        self._thread.join()


def _cancelled(endpoint: Endpoint) -> Cancelled:
    return Cancelled(f"answer from {_where(endpoint)} cancelled")


def _chat_body(
    endpoint: Endpoint,
    messages: Sequence[Mapping[str, Any]],
    *,
    stream: bool,
    max_tokens: int | None,
    temperature: float | None,
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    if isinstance(messages, (str, bytes)) or not messages:
        raise InvalidInput("messages must be a non-empty list of {role, content} objects")
    out = []
    for message in messages:
        if (
            not isinstance(message, Mapping)
            or not isinstance(message.get("role"), str)
            or not isinstance(message.get("content"), str)
        ):
            raise InvalidInput("each message must be {'role': str, 'content': str}")
        out.append(dict(message))
    body: dict[str, Any] = {"model": endpoint.model, "messages": out, "stream": stream}
    if temperature is not None:
        body["temperature"] = temperature
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    if tools:
        body["tools"] = [dict(t) for t in tools]
        body["tool_choice"] = "auto"
    return body


@dataclass(frozen=True)
class ToolCall:
    """A function call the model asked for: ``arguments`` is its JSON text, unparsed and untrusted."""

    id: str
    name: str
    arguments: str


def stream_chat_events(
    endpoint: Endpoint,
    messages: Sequence[Mapping[str, Any]],
    *,
    tools: Sequence[Mapping[str, Any]],
    timeout: Timeouts = DEFAULT_TIMEOUTS,
    cancel: threading.Event | None = None,
    max_tokens: int | None = None,
    temperature: float | None = 0.2,
    placement: Placement | None = None,
) -> Iterator[str | ToolCall]:
    """Like ``stream_chat`` with ``tools`` offered: text deltas as they come, then each ``ToolCall``.

    Tool calls are yielded only once the answer is complete (their arguments arrive in pieces),
    so a stream that breaks off never produces a half-formed call.
    """
    body = _chat_body(
        endpoint,
        messages,
        stream=True,
        max_tokens=max_tokens,
        temperature=temperature,
        tools=tools,
    )
    return _stream_chat(endpoint, body, timeout, cancel, placement, with_tools=True)


def stream_chat(
    endpoint: Endpoint,
    messages: Sequence[Mapping[str, Any]],
    *,
    timeout: Timeouts = DEFAULT_TIMEOUTS,
    cancel: threading.Event | None = None,
    max_tokens: int | None = None,
    temperature: float | None = 0.2,
    placement: Placement | None = None,
) -> Iterator[str]:
    """Stream a chat completion, yielding the answer's text deltas as they arrive.

    ``placement`` is where the caller's privacy gate decided the endpoint runs (the prompt was
    built for it); without one it is decided now. An on-device placement is connected only to
    the loopback addresses it was decided on.

    Raises (while iterating) ``LLMUnavailable`` naming the endpoint when it cannot be reached,
    times out, answers HTTP 4xx/5xx, sends malformed JSON, or ends before ``[DONE]`` (or a
    ``finish_reason``); ``Cancelled`` once ``cancel`` is set. ``InvalidInput`` (at call time)
    for malformed messages.
    """
    body = _chat_body(
        endpoint, messages, stream=True, max_tokens=max_tokens, temperature=temperature
    )
    return _stream_chat(endpoint, body, timeout, cancel, placement)


def _stream_chat(
    endpoint: Endpoint,
    body: dict[str, Any],
    timeout: Timeouts,
    cancel: threading.Event | None,
    placement: Placement | None,
    *,
    with_tools: bool = False,
) -> Iterator[Any]:
    if cancel is not None and cancel.is_set():
        raise _cancelled(endpoint)
    url = _api_url(endpoint, "chat/completions")
    placement = placement if placement is not None else locate(endpoint)
    watch = _CancelWatch(cancel) if cancel is not None else None
    extensions = {"trace": watch.trace} if watch is not None else {}
    try:
        with contextlib.ExitStack() as stack:
            client = stack.enter_context(_client(endpoint, timeout, placement))
            if watch is not None:
                # Entered after the client so that it exits first: the watcher lets go of the
                # socket before the connection is closed.
                stack.enter_context(watch)
            response = stack.enter_context(
                client.stream(
                    "POST", url, json=body, headers=_headers(endpoint), extensions=extensions
                )
            )
            _check_status(endpoint, response)
            content_type = response.headers.get("content-type", "").lower()
            if content_type.startswith("application/json"):
                # Some servers ignore "stream": the whole answer comes as one JSON document.
                yield from _json_answer(
                    endpoint, _read_capped(response, _MAX_JSON_BODY), with_tools=with_tools
                )
                return
            complete = False
            calls: dict[int, dict[str, str]] = {}
            for data in iter_sse_events(response.iter_bytes()):
                if cancel is not None and cancel.is_set():
                    raise _cancelled(endpoint)
                if data.strip() == "[DONE]":
                    complete = True
                    break
                choice = _first_choice(endpoint, _parse_json(endpoint, data))
                if choice is None:
                    continue
                delta = choice.get("delta") or {}
                content = delta.get("content") if isinstance(delta, dict) else None
                if isinstance(content, str) and content:
                    yield content
                if with_tools and isinstance(delta, dict):
                    _merge_tool_deltas(calls, delta.get("tool_calls"))
                if choice.get("finish_reason"):
                    # The answer is whole; [DONE] would only confirm it.
                    complete = True
            if cancel is not None and cancel.is_set():
                raise _cancelled(endpoint)
            if not complete:
                raise _unavailable(
                    endpoint,
                    "the answer stream ended without [DONE]; the answer is incomplete",
                    "incomplete",
                )
            for index in sorted(calls):
                call = calls[index]
                if call["name"]:
                    yield ToolCall(
                        id=call["id"] or f"call_{index}",
                        name=call["name"],
                        arguments=call["arguments"],
                    )
    except (httpx.HTTPError, httpx.InvalidURL) as err:
        if cancel is not None and cancel.is_set():
            raise _cancelled(endpoint) from err
        raise _map_transport_error(endpoint, err, timeout) from err


def _merge_tool_deltas(calls: dict[int, dict[str, str]], deltas: Any) -> None:
    """Join the pieces of streamed tool calls (OpenAI sends ``arguments`` a fragment at a time)."""
    if not isinstance(deltas, list):
        return
    for position, delta in enumerate(deltas):
        if not isinstance(delta, dict):
            continue
        index = delta.get("index", position)
        if not isinstance(index, int):
            continue
        call = calls.setdefault(index, {"id": "", "name": "", "arguments": ""})
        if isinstance(delta.get("id"), str):
            call["id"] = delta["id"]
        function = delta.get("function")
        if isinstance(function, dict):
            if isinstance(function.get("name"), str):
                call["name"] += function["name"]
            if isinstance(function.get("arguments"), str):
                call["arguments"] += function["arguments"]


def _json_answer(endpoint: Endpoint, body: bytes, *, with_tools: bool = False) -> Iterator[Any]:
    obj = _parse_json(endpoint, body.decode("utf-8", errors="replace"))
    choice = _first_choice(endpoint, obj)
    message = choice.get("message") if choice else None
    content = message.get("content") if isinstance(message, dict) else None
    raw_calls = message.get("tool_calls") if with_tools and isinstance(message, dict) else None
    if not isinstance(content, str) and not (content is None and raw_calls):
        raise _unavailable(endpoint, "the answer has no message content", "malformed")
    if content:
        yield content
    if raw_calls:
        calls: dict[int, dict[str, str]] = {}
        _merge_tool_deltas(calls, [{**c, "index": i} for i, c in enumerate(raw_calls)
                                   if isinstance(c, dict)])
        for index in sorted(calls):
            call = calls[index]
            if call["name"]:
                yield ToolCall(call["id"] or f"call_{index}", call["name"], call["arguments"])


def complete(
    endpoint: Endpoint,
    messages: Sequence[Mapping[str, Any]],
    *,
    timeout: Timeouts = DEFAULT_TIMEOUTS,
    cancel: threading.Event | None = None,
    max_tokens: int | None = None,
    temperature: float | None = 0.2,
    placement: Placement | None = None,
) -> str:
    """The whole answer as one string (built on ``stream_chat``, so it fails the same ways)."""
    return "".join(
        stream_chat(
            endpoint,
            messages,
            timeout=timeout,
            cancel=cancel,
            max_tokens=max_tokens,
            temperature=temperature,
            placement=placement,
        )
    )


def list_models(endpoint: Endpoint, *, timeout: Timeouts = DEFAULT_TIMEOUTS) -> list[str]:
    """The model ids the endpoint offers (``GET {base_url}/models``): a connection check."""
    url = _api_url(endpoint, "models")
    try:
        with (
            _client(endpoint, timeout, locate(endpoint)) as client,
            client.stream("GET", url, headers=_headers(endpoint)) as response,
        ):
            _check_status(endpoint, response)
            body = _read_capped(response, _MAX_JSON_BODY)
    except (httpx.HTTPError, httpx.InvalidURL) as err:
        raise _map_transport_error(endpoint, err, timeout) from err
    obj = _parse_json(endpoint, body.decode("utf-8", errors="replace"))
    data = obj.get("data")
    if not isinstance(data, list):
        raise _unavailable(endpoint, "GET /models did not return a model list", "malformed")
    return [m["id"] for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]
