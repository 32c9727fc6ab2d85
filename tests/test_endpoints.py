"""Model endpoints as the user configures them: URLs checked before saving, keys bound to the URL
they were given for, key variables of the user's choosing only, and keys never echoed back.

Through the real host (``config.set``/``config.get``/``chat``/``status``) and the real CLI, with
loopback model servers (tests/fakellm.py) recording what each one RECEIVED.
"""

from __future__ import annotations

import json
import sys

import pytest

from conftest import run_cli
from fakellm import FakeLLM
from hostproc import HostProcess

HOST = [sys.executable, "-m", "localkb", "host"]
BAD_URL = "http://xn--localhost-:11434/v1"
KEY = "sk-live-4f9a1b2c3d4e5f60718293a4"


def ok(host: HostProcess, rid, type_: str, data: dict | None = None) -> dict:
    reply = host.request({"id": rid, "type": type_, "data": data or {}}, timeout=300)
    assert reply.get("ok"), reply
    return reply["result"]


@pytest.fixture
def home(tmp_path):
    home = tmp_path / "home"
    notes = tmp_path / "tea.md"
    notes.write_text("# Tea\n\nGreen tea is brewed at 80 degrees Celsius for two minutes.\n")
    run_cli(["kb", "create", "Tea", "--privacy", "cloud"], home, check=True)
    run_cli(["add", "Tea", str(notes)], home, check=True)
    return home


# --------------------------------------------------------------------------- item 4: URLs


def test_a_malformed_url_is_refused_before_saving_and_nothing_else_breaks(home):
    with HostProcess(HOST, home=home) as host:
        good = {"name": "local", "base_url": "http://127.0.0.1:9/v1", "model": "m"}
        ok(host, 1, "config.set", {"endpoints": [good], "default_endpoint": "local"})
        bad = host.request({"id": 2, "type": "config.set", "data": {
            "endpoints": [good, {"name": "bad", "base_url": BAD_URL, "model": "m"}]}})
        assert not bad["ok"] and bad["error"]["code"] == "invalid_input", bad
        assert "bad" in bad["error"]["message"]
        got = ok(host, 3, "config.get")
        assert [e["name"] for e in got["endpoints"]] == ["local"]  # nothing was saved
        assert got["default_endpoint"] == "local"
    res = run_cli(["config", "endpoint", "add", "bad", BAD_URL, "m"], home)
    assert res.returncode == 2 and "invalid_input" in res.stderr, res.stderr


def test_a_malformed_url_already_stored_is_unknown_and_treated_as_cloud_everywhere(home):
    # A config.json written before URLs were checked (or edited by hand): every path still works.
    (home / "config.json").write_text(json.dumps({"endpoints": [
        {"name": "bad", "base_url": BAD_URL, "model": "m"}], "default_endpoint": "bad"}))
    with HostProcess(HOST, home=home) as host:
        got = ok(host, 1, "config.get")
        assert got["endpoints"][0]["location"] is None
        status = ok(host, 2, "status")
        assert status["ready"], status
        chat = ok(host, 3, "chat", {"kbs": ["Tea"], "message": "How hot is green tea brewed?"})
        assert chat["model"]["location"] is None and chat["generated"] is False
        assert any("failed" in n for n in chat["notes"])
    res = run_cli(["config", "endpoint", "list"], home)
    assert res.returncode == 0, res.stderr
    assert "unknown (treated as cloud)" in res.stdout


# --------------------------------------------------------------------------- item 5: keys


def _chat(host: HostProcess, rid, endpoint: str) -> dict:
    return ok(host, rid, "chat", {"kbs": ["Tea"], "message": "How hot is green tea brewed?",
                                  "endpoint": endpoint})


def test_host_changing_an_endpoints_url_drops_its_stored_key(home):
    with FakeLLM(reply="At 80 degrees [1].") as first, FakeLLM(reply="At 80 [1].") as second, \
            HostProcess(HOST, home=home) as host:
        ok(host, 1, "config.set", {"endpoints": [
            {"name": "openai", "base_url": first.base_url, "model": "m", "api_key": KEY}]})
        # The same URL without a key keeps it...
        kept = ok(host, 2, "config.set", {"endpoints": [
            {"name": "openai", "base_url": first.base_url, "model": "m2"}]})
        assert kept["endpoints"][0]["api_key_set"] is True
        _chat(host, 3, "openai")
        assert first.request_headers[-1]["authorization"] == f"Bearer {KEY}"
        # ...a new URL without a key does not take it along.
        moved = ok(host, 4, "config.set", {"endpoints": [
            {"name": "openai", "base_url": second.base_url, "model": "m2"}]})
        assert moved["endpoints"][0]["api_key_set"] is False
        _chat(host, 5, "openai")
        assert second.requests, "the new URL was asked"
        assert "authorization" not in second.request_headers[-1]
        assert KEY not in json.dumps(second.request_headers)
    assert KEY not in (home / "config.json").read_text()


def test_cli_changing_an_endpoints_url_drops_its_stored_key(home):
    with FakeLLM(reply="At 80 degrees [1].") as first, FakeLLM(reply="At 80 [1].") as second:
        res = run_cli(["config", "endpoint", "add", "openai", first.base_url, "m", "--api-key-stdin",
                       "--default"], home, input=KEY + "\n")
        assert res.returncode == 0, res.stderr
        res = run_cli(["config", "endpoint", "add", "openai", second.base_url, "m"], home)
        assert res.returncode == 0, res.stderr
        assert "key" in res.stdout and "dropped" in res.stdout, res.stdout
        res = run_cli(["ask", "Tea", "How hot is green tea brewed?", "--json"], home)
        assert res.returncode == 0, res.stderr
        assert second.requests and "authorization" not in second.request_headers[-1]


@pytest.mark.parametrize("name", ["HOME", "PATH", "AWS_SECRET_ACCESS_KEY", "LOCALKB_PASSPHRASE",
                                  "my_api_key", "OPENAI_API_KEY\n", ""])
def test_api_key_env_may_name_only_a_key_variable(home, name):
    with HostProcess(HOST, home=home) as host:
        reply = host.request({"id": 1, "type": "config.set", "data": {"endpoints": [
            {"name": "x", "base_url": "http://127.0.0.1:9/v1", "model": "m", "api_key_env": name}]}})
        assert not reply["ok"] and reply["error"]["code"] == "invalid_input", reply
    res = run_cli(["config", "endpoint", "add", "x", "http://127.0.0.1:9/v1", "m",
                   "--api-key-env", name], home)
    assert res.returncode == 2, res.stdout + res.stderr


def test_a_refused_variable_is_never_read_and_an_allowed_one_is(home):
    with FakeLLM(reply="At 80 [1].") as llm, HostProcess(
            HOST, home=home, env={"MY_LLM_API_KEY": "sk-env-0123456789abcdef"}) as host:
        # An old config.json naming HOME: it loads, but the variable is never sent.
        (home / "config.json").write_text(json.dumps({"endpoints": [
            {"name": "old", "base_url": llm.base_url, "model": "m", "api_key_env": "HOME"}]}))
        got = ok(host, 1, "config.get")
        assert got["endpoints"][0]["api_key_set"] is False
        _chat(host, 2, "old")
        assert "authorization" not in llm.request_headers[-1]
        ok(host, 3, "config.set", {"endpoints": [
            {"name": "new", "base_url": llm.base_url, "model": "m", "api_key_env": "MY_LLM_API_KEY"}]})
        _chat(host, 4, "new")
        assert llm.request_headers[-1]["authorization"] == "Bearer sk-env-0123456789abcdef"


# --------------------------------------------------------------------------- item 6: echoes


def _echo(headers: dict[str, str]) -> str:
    auth = headers.get("authorization", "")
    return (f"invalid credentials: {auth} (key {auth.removeprefix('Bearer ')}); also tried "
            "Bearer abc.DEF-ghi_123456 and sk-proj-AAAABBBBCCCCDDDD")


def test_a_key_echoed_by_the_server_never_reaches_the_reply_the_logs_or_the_catalogue(home):
    with FakeLLM(mode="http_error", status=401, error_message=_echo) as llm, \
            HostProcess(HOST, home=home) as host:
        ok(host, 1, "config.set", {"endpoints": [
            {"name": "cloud", "base_url": llm.base_url, "model": "m", "api_key": KEY}]})
        reply = host.request({"id": 2, "type": "chat", "data": {
            "kbs": ["Tea"], "message": "How hot is green tea brewed?", "endpoint": "cloud"}})
        errors = ok(host, 3, "errors.list", {"limit": 50})
        assert llm.request_headers[-1]["authorization"] == f"Bearer {KEY}"  # the echo happened
    text = json.dumps(reply) + json.dumps(errors)
    assert "invalid credentials" in text  # the server's words are kept...
    assert "[redacted]" in text
    for secret in (KEY, "abc.DEF-ghi_123456", "sk-proj-AAAABBBBCCCCDDDD"):  # ...its echoes are not
        assert secret not in text, secret
        assert secret not in (home / "logs" / "host.log").read_text()
        for db in home.glob("catalog.sqlite*"):  # the database, its WAL and shared memory
            assert secret.encode() not in db.read_bytes(), (secret, db.name)
    log = run_cli(["log", "--json"], home)
    assert KEY not in log.stdout and "sk-proj-AAAABBBBCCCCDDDD" not in log.stdout
