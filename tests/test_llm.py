"""The model client against a real HTTP server on loopback, the SSE parser byte by byte, and
the endpoint configuration file."""

from __future__ import annotations

import json
import os
import socket
import stat
import threading

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fakellm import FakeLLM, split_tokens
from localkb.answer.llm import (
    Endpoint,
    LLMConfig,
    Timeouts,
    complete,
    iter_sse_events,
    list_models,
    load_config,
    save_config,
    stream_chat,
)
from localkb.errors import Cancelled, InvalidInput, LLMUnavailable, NotFound

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
REPLY = "Paris is the capital — café, naïve, 日本語 [1]. Second line\nand more words here."
# Generous: a test that hits one of these has failed, it is never what the test measures.
PATIENT = Timeouts(connect=5, read=30)


def endpoint_for(fake: FakeLLM, **kw: object) -> Endpoint:
    return Endpoint(name=kw.pop("name", "fake"), base_url=fake.base_url, model="fake-model", **kw)


def free_port() -> int:
    """A port nothing listens on: bound, then closed."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --------------------------------------------------------------------------- SSE parser

SSE_EVENTS = [
    '{"a": 1}',
    "two\nlines",
    "  leading spaces kept after the first",
    "unicode: café 日本語 🙂",
    "[DONE]",
]


def sse_bytes(events: list[str], eol: str) -> bytes:
    out = [f": a comment{eol}", f"event: message{eol}id: 7{eol}retry: 100{eol}{eol}"]
    for event in events:
        out += [f"data: {line}{eol}" for line in event.split("\n")]
        out.append(eol)
    return "".join(out).encode("utf-8")


def one_byte_chunks(data: bytes) -> list[bytes]:
    return [data[i : i + 1] for i in range(len(data))]


@pytest.mark.parametrize("eol", ["\n", "\r\n", "\r"])
def test_sse_parser_reads_every_line_ending(eol: str) -> None:
    assert list(iter_sse_events([sse_bytes(SSE_EVENTS, eol)])) == SSE_EVENTS


@pytest.mark.parametrize("eol", ["\n", "\r\n", "\r"])
def test_sse_parser_fed_byte_by_byte_gives_the_same_events(eol: str) -> None:
    # Splits every multi-byte UTF-8 character and every \r\n across chunks.
    assert list(iter_sse_events(one_byte_chunks(sse_bytes(SSE_EVENTS, eol)))) == SSE_EVENTS


def test_crlf_stream_is_not_read_as_zero_events() -> None:
    # The classic bug: splitting on "\n\n" finds no separator in a CRLF stream.
    data = b"data: one\r\n\r\ndata: two\r\n\r\n"
    assert list(iter_sse_events([data])) == ["one", "two"]


def test_crlf_split_between_cr_and_lf_is_one_line_ending() -> None:
    # Read as two line endings, the \r\n would end the event early and yield "a" and "b".
    chunks = [b"data: a\r", b"\ndata: b\r", b"\n\r", b"\n"]
    assert list(iter_sse_events(chunks)) == ["a\nb"]


def test_data_field_with_and_without_space() -> None:
    data = b"data:tight\n\ndata: spaced\n\ndata:  two spaces\n\n"
    assert list(iter_sse_events([data])) == ["tight", "spaced", " two spaces"]


def test_multiline_data_fields_join_with_newline() -> None:
    assert list(iter_sse_events([b"data: a\ndata:\ndata: c\n\n"])) == ["a\n\nc"]


def test_comments_and_other_fields_dispatch_nothing() -> None:
    data = b": ping\n\nevent: x\nid: 1\n\n:\n\ndata: real\n\n"
    assert list(iter_sse_events([data])) == ["real"]


def test_field_name_without_colon_is_an_empty_value() -> None:
    assert list(iter_sse_events([b"data\ndata: x\n\n"])) == ["\nx"]


def test_unfinished_event_at_end_of_stream_is_discarded() -> None:
    assert list(iter_sse_events([b"data: whole\n\ndata: half"])) == ["whole"]
    assert list(iter_sse_events([b"data: whole\n\ndata: no blank line\n"])) == ["whole"]


def test_leading_byte_order_mark_is_ignored() -> None:
    assert list(iter_sse_events([b"\xef\xbb", b"\xbfdata: x\n\n"])) == ["x"]


def test_done_is_delivered_as_its_own_event() -> None:
    events = list(iter_sse_events([b'data: {"x":1}\n\ndata: [DONE]\n\n']))
    assert events == ['{"x":1}', "[DONE]"]


# No deadline: a test never fails on wall-clock time (a busy CI machine is slow, not wrong).
@settings(deadline=None)
@given(
    eol=st.sampled_from(["\n", "\r\n", "\r"]),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=30),
)
def test_sse_parser_is_independent_of_chunk_boundaries(eol: str, cuts: list[int]) -> None:
    data = sse_bytes(SSE_EVENTS, eol)
    points = sorted({c % (len(data) + 1) for c in cuts})
    chunks = [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]
    assert list(iter_sse_events(chunks)) == SSE_EVENTS


# --------------------------------------------------------------------------- streaming


def stream_text(mode: str) -> str:
    with FakeLLM(mode=mode, reply=REPLY) as fake:
        return "".join(stream_chat(endpoint_for(fake), MESSAGES, timeout=PATIENT))


def test_lf_crlf_and_cr_streams_give_the_same_text() -> None:
    assert stream_text("lf") == REPLY
    assert stream_text("crlf") == REPLY
    assert stream_text("cr") == REPLY


def test_stream_yields_one_delta_per_token() -> None:
    with FakeLLM(reply=REPLY) as fake:
        deltas = list(stream_chat(endpoint_for(fake), MESSAGES, timeout=PATIENT))
    assert deltas == split_tokens(REPLY)
    assert len(deltas) > 5


def test_request_carries_model_messages_and_options() -> None:
    with FakeLLM() as fake:
        complete(endpoint_for(fake), MESSAGES, timeout=PATIENT, max_tokens=50, temperature=0.0)
        body = fake.requests[0]
    assert body["model"] == "fake-model"
    assert body["messages"] == MESSAGES
    assert body["stream"] is True
    assert body["max_tokens"] == 50
    assert body["temperature"] == 0.0


def test_reply_can_be_scripted_from_the_request() -> None:
    def echo_passages(request: dict) -> str:
        prompt = request["messages"][-1]["content"]
        return " ".join(f"[{n}]" for n in range(1, prompt.count("<passage") + 1))

    prompt = "<passage 1>a</passage> <passage 2>b</passage> <passage 3>c</passage>"
    with FakeLLM(reply_fn=echo_passages) as fake:
        answer = complete(endpoint_for(fake), [{"role": "user", "content": prompt}])
    assert answer == "[1] [2] [3]"


def test_complete_accepts_a_server_that_ignores_stream() -> None:
    with FakeLLM(mode="json_only", reply=REPLY) as fake:
        assert complete(endpoint_for(fake), MESSAGES, timeout=PATIENT) == REPLY


def test_list_models_reads_the_models_route() -> None:
    with FakeLLM(model="llama-test") as fake:
        assert list_models(endpoint_for(fake), timeout=PATIENT) == ["llama-test"]


# --------------------------------------------------------------------------- failures


def assert_names_endpoint(err: LLMUnavailable, endpoint: Endpoint) -> None:
    assert endpoint.name in err.message
    assert endpoint.base_url in err.message
    assert err.code == "llm_unavailable"
    assert err.detail["endpoint"] == endpoint.name


def test_stream_cut_midway_raises_llm_unavailable_after_partial_output() -> None:
    got: list[str] = []
    with FakeLLM(mode="fail_midstream", reply=REPLY, cut_after=4) as fake:
        endpoint = endpoint_for(fake, name="cut-cloud")
        with pytest.raises(LLMUnavailable) as info:
            for delta in stream_chat(endpoint, MESSAGES, timeout=PATIENT):
                got.append(delta)
    assert got == split_tokens(REPLY)[:4]
    assert_names_endpoint(info.value, endpoint)
    assert info.value.detail["reason"] == "incomplete"
    assert isinstance(info.value.__cause__, httpx.HTTPError)


def test_stream_ending_cleanly_without_done_is_incomplete() -> None:
    with FakeLLM(mode="no_done", reply=REPLY, cut_after=3) as fake:
        endpoint = endpoint_for(fake)
        with pytest.raises(LLMUnavailable) as info:
            complete(endpoint, MESSAGES, timeout=PATIENT)
    assert_names_endpoint(info.value, endpoint)
    assert "[DONE]" in info.value.message


def test_malformed_json_event_raises_llm_unavailable() -> None:
    with FakeLLM(mode="bad_json", reply=REPLY, cut_after=2) as fake:
        endpoint = endpoint_for(fake)
        with pytest.raises(LLMUnavailable) as info:
            complete(endpoint, MESSAGES, timeout=PATIENT)
    assert_names_endpoint(info.value, endpoint)
    assert info.value.detail["reason"] == "malformed"
    assert isinstance(info.value.__cause__, json.JSONDecodeError)


def test_error_event_in_stream_raises_with_the_servers_message() -> None:
    with FakeLLM(mode="error_event", reply=REPLY) as fake:
        endpoint = endpoint_for(fake)
        with pytest.raises(LLMUnavailable) as info:
            complete(endpoint, MESSAGES, timeout=PATIENT)
    assert_names_endpoint(info.value, endpoint)
    assert "model overloaded" in info.value.message


def test_hanging_server_raises_after_the_read_timeout() -> None:
    with FakeLLM(mode="hang") as fake:
        endpoint = endpoint_for(fake, name="hung")
        with pytest.raises(LLMUnavailable) as info:
            complete(endpoint, MESSAGES, timeout=Timeouts(connect=5, read=0.5))
    assert_names_endpoint(info.value, endpoint)
    assert info.value.detail["reason"] == "timeout"
    assert isinstance(info.value.__cause__, httpx.ReadTimeout)


def test_refused_port_raises_llm_unavailable_naming_the_endpoint() -> None:
    endpoint = Endpoint("local-ollama", f"http://127.0.0.1:{free_port()}/v1", "llama3")
    with pytest.raises(LLMUnavailable) as info:
        complete(endpoint, MESSAGES, timeout=PATIENT)
    assert_names_endpoint(info.value, endpoint)
    assert info.value.detail["reason"] == "unreachable"
    assert isinstance(info.value.__cause__, httpx.ConnectError)


def test_server_gone_after_shutdown_is_unavailable() -> None:
    with FakeLLM() as fake:
        endpoint = endpoint_for(fake)
    with pytest.raises(LLMUnavailable):
        complete(endpoint, MESSAGES, timeout=PATIENT)


def test_http_500_raises_with_status_and_server_message() -> None:
    with FakeLLM(mode="http_error") as fake:
        endpoint = endpoint_for(fake)
        with pytest.raises(LLMUnavailable) as info:
            complete(endpoint, MESSAGES, timeout=PATIENT)
    assert_names_endpoint(info.value, endpoint)
    assert "HTTP 500" in info.value.message
    assert "failed on purpose" in info.value.message
    assert info.value.detail["status"] == 500


def test_http_401_without_a_key_says_which_variable_is_empty(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("LOCALKB_TEST_NO_SUCH_API_KEY", raising=False)
    with FakeLLM(mode="http_error", status=401) as fake:
        endpoint = endpoint_for(fake, api_key_env="LOCALKB_TEST_NO_SUCH_API_KEY")
        with pytest.raises(LLMUnavailable) as info:
            complete(endpoint, MESSAGES, timeout=PATIENT)
    assert "HTTP 401" in info.value.message
    assert "LOCALKB_TEST_NO_SUCH_API_KEY" in info.value.message


@pytest.mark.parametrize("url", ["auto", "", "ftp://127.0.0.1/v1", "http://[::1/v1"])
def test_unusable_base_url_is_unavailable_not_a_crash(url: str) -> None:
    endpoint = Endpoint("odd", url, "m")
    with pytest.raises(LLMUnavailable) as info:
        complete(endpoint, MESSAGES, timeout=PATIENT)
    assert info.value.detail["reason"] == "invalid_url"
    assert "'odd'" in info.value.message


@pytest.mark.parametrize("messages", [[], "hello", [{"role": "user"}], [{"content": "x"}]])
def test_malformed_messages_are_invalid_input(messages: object) -> None:
    with pytest.raises(InvalidInput):
        stream_chat(Endpoint("e", "http://127.0.0.1:1/v1", "m"), messages)  # type: ignore[arg-type]


def test_loopback_endpoint_ignores_proxy_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    # A proxy would carry an on-device prompt off the machine; here it points at a dead port,
    # so the answer only arrives if the client went straight to the loopback server.
    dead = f"http://127.0.0.1:{free_port()}"
    for var in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(var, dead)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    with FakeLLM(reply=REPLY) as fake:
        assert complete(endpoint_for(fake), MESSAGES, timeout=PATIENT) == REPLY


# --------------------------------------------------------------------------- cancellation


def test_cancel_from_another_thread_stops_the_stream() -> None:
    reply = " ".join(f"w{i}" for i in range(400))
    cancel = threading.Event()
    got: list[str] = []
    with FakeLLM(mode="slow", reply=reply, delay=0.02) as fake:
        endpoint = endpoint_for(fake)
        with pytest.raises(Cancelled) as info:
            for delta in stream_chat(endpoint, MESSAGES, timeout=PATIENT, cancel=cancel):
                got.append(delta)
                if len(got) == 3:
                    threading.Thread(target=cancel.set).start()
        # The client closed the connection: the server's next write found nobody there.
        assert fake.client_disconnected.wait(10)
    assert info.value.code == "cancelled"
    assert 3 <= len(got) < 400


def test_cancel_interrupts_a_read_blocked_on_a_silent_server() -> None:
    # The read timeout is long: only the cancel can end this read; if it did not, the
    # error would be LLMUnavailable (timeout), not Cancelled.
    cancel = threading.Event()
    with FakeLLM(mode="hang") as fake:
        endpoint = endpoint_for(fake)
        stream = stream_chat(
            endpoint, MESSAGES, timeout=Timeouts(connect=5, read=30), cancel=cancel
        )
        timer = threading.Timer(0.2, cancel.set)
        timer.start()
        with pytest.raises(Cancelled) as info:
            list(stream)
        timer.join()
    # Had the cancel not closed the socket, the read would have ended in its timeout.
    assert not isinstance(info.value.__cause__, httpx.TimeoutException)


def test_cancel_set_before_start_sends_nothing() -> None:
    cancel = threading.Event()
    cancel.set()
    with FakeLLM() as fake:
        with pytest.raises(Cancelled):
            complete(endpoint_for(fake), MESSAGES, cancel=cancel)
        assert fake.requests == []


def test_unused_cancel_event_does_not_disturb_a_stream() -> None:
    with FakeLLM(mode="crlf", reply=REPLY) as fake:
        text = complete(endpoint_for(fake), MESSAGES, timeout=PATIENT, cancel=threading.Event())
    assert text == REPLY


def test_abandoning_a_stream_closes_the_connection() -> None:
    reply = " ".join(f"w{i}" for i in range(400))
    with FakeLLM(mode="slow", reply=reply, delay=0.02) as fake:
        stream = stream_chat(endpoint_for(fake), MESSAGES, timeout=PATIENT)
        assert next(stream) == "w0 "
        stream.close()
        assert fake.client_disconnected.wait(10)


def test_fake_server_stops_its_threads_and_port_on_exit() -> None:
    before = set(threading.enumerate())
    with FakeLLM(mode="hang") as fake:
        endpoint = endpoint_for(fake)
        with pytest.raises(LLMUnavailable):
            complete(endpoint, MESSAGES, timeout=Timeouts(connect=5, read=0.3))
    assert set(threading.enumerate()) <= before
    with pytest.raises(LLMUnavailable) as info:
        complete(endpoint, MESSAGES, timeout=PATIENT)
    assert info.value.detail["reason"] == "unreachable"


# --------------------------------------------------------------------------- keys


def test_environment_key_wins_over_stored_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCALKB_TEST_API_KEY", "sk-from-env")
    with FakeLLM() as fake:
        endpoint = endpoint_for(fake, api_key_env="LOCALKB_TEST_API_KEY", api_key="sk-stored")
        complete(endpoint, MESSAGES, timeout=PATIENT)
        assert fake.request_headers[0]["authorization"] == "Bearer sk-from-env"


def test_stored_key_is_used_when_the_variable_is_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LOCALKB_TEST_API_KEY", raising=False)
    with FakeLLM() as fake:
        endpoint = endpoint_for(fake, api_key_env="LOCALKB_TEST_API_KEY", api_key="sk-stored")
        complete(endpoint, MESSAGES, timeout=PATIENT)
        assert fake.request_headers[0]["authorization"] == "Bearer sk-stored"


def test_no_key_sends_no_authorization_header() -> None:
    with FakeLLM() as fake:
        complete(endpoint_for(fake), MESSAGES, timeout=PATIENT)
        assert "authorization" not in fake.request_headers[0]


def test_key_never_appears_in_repr_public_dict_or_errors() -> None:
    endpoint = Endpoint("cloud", f"http://127.0.0.1:{free_port()}/v1", "m", api_key="sk-SECRET")
    public = endpoint.public_dict()
    assert "sk-SECRET" not in repr(endpoint)
    assert "sk-SECRET" not in json.dumps(public)
    assert public["api_key_set"] is True
    with pytest.raises(LLMUnavailable) as info:
        complete(endpoint, MESSAGES, timeout=PATIENT)
    assert "sk-SECRET" not in str(info.value)
    assert "sk-SECRET" not in json.dumps(info.value.to_dict())


def test_password_in_base_url_is_not_shown() -> None:
    endpoint = Endpoint("proxy", f"http://user:hunter2@127.0.0.1:{free_port()}/v1", "m")
    assert "hunter2" not in json.dumps(endpoint.public_dict())
    with pytest.raises(LLMUnavailable) as info:
        complete(endpoint, MESSAGES, timeout=PATIENT)
    assert "hunter2" not in str(info.value)
    assert "127.0.0.1" in str(info.value)


# --------------------------------------------------------------------------- config file


def sample_config() -> LLMConfig:
    return LLMConfig(
        endpoints=(
            Endpoint("ollama", "http://127.0.0.1:11434/v1", "llama3.2"),
            Endpoint(
                "openai",
                "https://api.openai.com/v1",
                "gpt-4o-mini",
                api_key_env="OPENAI_API_KEY",
                api_key="sk-stored",
            ),
            Endpoint("litellm", "http://localhost:4000/v1", "claude", mark_cloud=True),
        ),
        default_endpoint="ollama",
    )


def mode_of(path: os.PathLike) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_config_round_trips_and_is_0600(tmp_path) -> None:
    save_config(tmp_path, sample_config())
    assert mode_of(tmp_path / "config.json") == 0o600
    loaded = load_config(tmp_path)
    assert loaded == sample_config()
    assert loaded.default is not None and loaded.default.name == "ollama"
    assert loaded.get("litellm").mark_cloud is True
    assert loaded.get("openai").api_key == "sk-stored"


def test_config_rewrite_restores_0600_and_leaves_no_temp_files(tmp_path) -> None:
    save_config(tmp_path, sample_config())
    os.chmod(tmp_path / "config.json", 0o644)
    save_config(tmp_path, LLMConfig(endpoints=sample_config().endpoints, default_endpoint=None))
    assert mode_of(tmp_path / "config.json") == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json"]
    assert load_config(tmp_path).default is None


def test_config_keeps_other_settings_in_the_file(tmp_path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"theme": "dark", "endpoints": []}))
    save_config(tmp_path, sample_config())
    data = json.loads((tmp_path / "config.json").read_text())
    assert data["theme"] == "dark"
    assert [e["name"] for e in data["endpoints"]] == ["ollama", "openai", "litellm"]


def test_missing_config_means_no_endpoints(tmp_path) -> None:
    config = load_config(tmp_path)
    assert config.endpoints == ()
    assert config.default is None


def test_public_config_hides_keys_but_says_one_is_set(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    save_config(tmp_path, sample_config())
    public = load_config(tmp_path).public_dict()
    assert "sk-stored" not in json.dumps(public)
    by_name = {e["name"]: e for e in public["endpoints"]}
    assert by_name["openai"]["api_key_set"] is True
    assert by_name["ollama"]["api_key_set"] is False
    assert by_name["ollama"]["location"] == "device"
    assert by_name["litellm"]["location"] == "cloud"


def test_unknown_endpoint_name_is_not_found() -> None:
    with pytest.raises(NotFound) as info:
        sample_config().get("nope")
    assert "ollama" in info.value.message


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        "[]",
        '{"endpoints": {}}',
        '{"endpoints": [{"name": "a", "base_url": "http://127.0.0.1/v1"}]}',
        '{"endpoints": [{"name": "a", "base_url": "u", "model": "m", "mark_cloud": "yes"}]}',
        '{"endpoints": [], "default_endpoint": "ghost"}',
        '{"endpoints": [{"name": "a", "base_url": "u", "model": "m"},'
        ' {"name": "a", "base_url": "v", "model": "m"}]}',
    ],
)
def test_malformed_config_is_invalid_input(tmp_path, content: str) -> None:
    (tmp_path / "config.json").write_text(content)
    with pytest.raises(InvalidInput):
        load_config(tmp_path)
