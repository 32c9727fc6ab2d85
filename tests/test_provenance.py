"""History laundering: an answer's provenance is every knowledge base that reached its prompt.

An on-device model that restates an earlier device-only answer must not produce a turn that a
cloud model may read. The turn's ``kbs`` is the union of its passages' knowledge bases and those
of every history turn that reached its prompt (the rewrite prompt or the chat prompt); a history
turn that does not say where it came from counts as device only.

Proven end to end, from what a loopback recorder marked cloud RECEIVED, through the real host
(the side panel's path: it sends each turn's ``kbs`` back in ``history``) and through the real
``localkb chat`` with the default endpoint switched to the cloud one in the middle of the chat.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import pytest

from conftest import run_cli
from fakellm import FakeLLM
from hostproc import HostProcess

HOST = [sys.executable, "-m", "localkb", "host"]
CANARY = "ZEBRA-7731-CANARY"
DIARY = f"Dear diary: the spare key code is {CANARY}; the key hides under the blue doormat."
SOUP = ("Tomato soup: simmer the tomatoes with basil and garlic for twenty minutes, then blend "
        "until smooth and season with salt.")
Q1 = "What is the spare key code under the doormat?"
Q2 = "How long does the tomato soup simmer with basil?"
Q3 = "and for how long?"  # a follow-up: it is rewritten with the history


def _device_model(body: dict) -> str:
    """An on-device model that restates whatever it saw, canary included (the laundering step)."""
    last = body["messages"][-1]["content"]
    if "Standalone search query:" in last:
        return "tomato soup simmer time"
    seen = json.dumps(body["messages"])
    if CANARY in seen:
        return f"The code is {CANARY}, and the soup simmers for twenty minutes [1]."
    return "The soup simmers for twenty minutes [1]."


def _cloud_model(body: dict) -> str:
    last = body["messages"][-1]["content"]
    return "tomato soup simmer time" if "Standalone search query:" in last else "Twenty minutes [1]."


@pytest.fixture
def home(tmp_path):
    home = tmp_path / "home"
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "diary.md").write_text(f"# Diary\n\n{DIARY}\n")
    (notes / "soup.md").write_text(f"# Soup\n\n{SOUP}\n")
    run_cli(["kb", "create", "Diary", "--privacy", "device"], home, check=True)
    run_cli(["kb", "create", "Recipes", "--privacy", "cloud"], home, check=True)
    run_cli(["add", "Diary", str(notes / "diary.md")], home, check=True)
    run_cli(["add", "Recipes", str(notes / "soup.md")], home, check=True)
    return home


def _configure(home, local: FakeLLM, cloudy: FakeLLM) -> None:
    run_cli(["config", "endpoint", "add", "local", local.base_url, "m", "--default"], home, check=True)
    run_cli(["config", "endpoint", "add", "cloudy", cloudy.base_url, "m", "--mark-cloud"], home,
            check=True)


def _received(llm: FakeLLM) -> str:
    return "\n".join(json.dumps(r, ensure_ascii=False) for r in llm.requests)


def _chat(host: HostProcess, rid: int, kbs: list[str], message: str, history: list[dict],
          endpoint: str) -> dict:
    reply = host.request({"id": rid, "type": "chat", "data": {
        "kbs": kbs, "message": message, "history": history, "endpoint": endpoint}}, timeout=300)
    assert reply["ok"], reply
    return reply["result"]


def test_host_a_restated_device_answer_never_reaches_a_cloud_model(home):
    with (FakeLLM(reply_fn=_device_model) as local, FakeLLM(reply_fn=_cloud_model) as cloudy,
          HostProcess(HOST, home=home) as host):
        _configure(home, local, cloudy)
        diary_id = json.loads(run_cli(["kb", "list", "--json"], home).stdout)["knowledge_bases"][0]["id"]
        history: list[dict] = []
        first = _chat(host, 1, ["Diary", "Recipes"], Q1, history, "local")
        assert CANARY in first["answer"] and diary_id in first["kbs"]
        history += [{"role": "user", "content": Q1},
                    {"role": "assistant", "content": first["answer"], "kbs": first["kbs"]}]
        # Only the cloud knowledge base is searched: the device model restates the canary
        # from the history, and the answer's passages are all from Recipes.
        second = _chat(host, 2, ["Recipes"], Q2, history, "local")
        assert CANARY in second["answer"]
        assert {c["kb_name"] for c in second["citations"]} == {"Recipes"}
        assert diary_id in second["kbs"], second["kbs"]  # the history's provenance carries over
        history += [{"role": "user", "content": Q2},
                    {"role": "assistant", "content": second["answer"], "kbs": second["kbs"]}]
        third = _chat(host, 3, ["Diary", "Recipes"], Q3, history, "cloudy")
        sent = _received(cloudy)
    assert len(cloudy.requests) == 2, "the cloud model was asked to rewrite and to answer"
    assert "Standalone search query:" in json.dumps(cloudy.requests[0])
    assert "simmer the tomatoes" in json.dumps(cloudy.requests[1])  # the cloud KB's passage went
    assert Q2 in sent  # the user's own words went too
    assert CANARY not in sent
    assert third["model"]["location"] == "cloud"


def test_host_a_history_turn_without_provenance_taints_the_answer_as_device_only(home):
    with (FakeLLM(reply_fn=_device_model) as local, FakeLLM(reply_fn=_cloud_model) as cloudy,
          HostProcess(HOST, home=home) as host):
        _configure(home, local, cloudy)
        history = [{"role": "user", "content": Q1},
                   {"role": "assistant", "content": f"It is {CANARY}."}]  # no kbs: unknown
        second = _chat(host, 1, ["Recipes"], Q2, history, "local")
        assert CANARY in second["answer"]
        history += [{"role": "user", "content": Q2},
                    {"role": "assistant", "content": second["answer"], "kbs": second["kbs"]}]
        _chat(host, 2, ["Recipes"], Q3, history, "cloudy")
        sent = _received(cloudy)
    assert cloudy.requests and CANARY not in sent


def _read_json_line(proc: subprocess.Popen, lines: list[str]) -> dict:
    while True:
        line = proc.stdout.readline()
        assert line, f"localkb chat ended early; output so far: {lines}"
        lines.append(line)
        if line.startswith("{"):
            return json.loads(line)


def test_cli_chat_switching_the_default_to_a_cloud_model_mid_chat_never_sends_the_canary(home):
    import os

    with FakeLLM(reply_fn=_device_model) as local, FakeLLM(reply_fn=_cloud_model) as cloudy:
        _configure(home, local, cloudy)
        proc = subprocess.Popen([sys.executable, "-m", "localkb", "chat", "Diary", "Recipes", "--json"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env={**os.environ, "LOCALKB_HOME": str(home)})
        err: list[str] = []
        threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True).start()
        lines: list[str] = []
        try:
            proc.stdin.write(Q1 + "\n")
            proc.stdin.flush()
            first = _read_json_line(proc, lines)
            assert CANARY in first["answer"]
            proc.stdin.write(Q2 + "\n")
            proc.stdin.flush()
            second = _read_json_line(proc, lines)
            statuses = {s["kb_name"]: s["status"] for s in second["statuses"]}
            assert statuses["Diary"] != "passages", statuses  # the canary comes from the history only
            assert CANARY in second["answer"]
            run_cli(["config", "endpoint", "default", "cloudy"], home, check=True)
            proc.stdin.write(Q3 + "\n")
            proc.stdin.flush()
            third = _read_json_line(proc, lines)
            proc.stdin.close()
            assert proc.wait(timeout=120) == 0, err
        finally:
            if proc.poll() is None:
                proc.kill()
        sent = _received(cloudy)
    assert third["model"]["name"] == "cloudy" and third["model"]["location"] == "cloud"
    assert len(cloudy.requests) == 2, "the cloud model was asked to rewrite and to answer"
    assert "simmer the tomatoes" in sent
    assert CANARY not in sent


# --------------------------------------------------------------------------- continuing a stopped answer
# A stopped answer is text a model wrote from a prompt; continuing it sends that text back to a
# model. It carries the provenance of the prompt it came from (the host says it in a
# ``provenance`` event before the first token, so a stopped turn knows it too), and the gate
# decides whether the model asked to continue may read it: unknown provenance is device only.


def _stopped_partial(host: HostProcess, rid: int, kbs: list[str], message: str) -> tuple[str, list]:
    """A chat turn on the device model, with the events it streamed (as a stopped turn keeps them)."""
    host.send({"id": rid, "type": "chat", "data": {
        "kbs": kbs, "message": message, "history": [], "endpoint": "local"}})
    *messages, reply = host.until_reply(rid, timeout=300)
    events = [(m["event"], m.get("data")) for m in messages]
    assert reply["ok"], reply
    return reply["result"]["answer"], events


def test_host_a_stopped_device_answer_is_never_continued_by_a_cloud_model(home):
    with (FakeLLM(reply_fn=_device_model) as local, FakeLLM(reply_fn=_cloud_model) as cloudy,
          HostProcess(HOST, home=home) as host):
        _configure(home, local, cloudy)
        answer, events = _stopped_partial(host, 1, ["Diary", "Recipes"], Q1)
        assert CANARY in answer
        partial = answer[: answer.index(CANARY) + len(CANARY)]
        said = [d["kbs"] for e, d in events if e == "provenance"]
        replies = []
        # With the provenance the host announced, and without any (unknown: device only).
        for rid, extra in ((2, {"continue_kbs": said[0]} if said else {}), (3, {})):
            replies.append(host.request({"id": rid, "type": "chat", "data": {
                "kbs": ["Recipes"], "message": Q2, "history": [], "endpoint": "cloudy",
                "continue_from": partial, **extra}}, timeout=300))
        sent = _received(cloudy)
    assert CANARY not in sent
    for reply in replies:
        assert not reply["ok"] and reply["error"]["code"] == "privacy_blocked", reply
        assert "Diary" in reply["error"]["message"] or "unknown" in reply["error"]["message"]


def test_host_announces_a_turns_provenance_before_its_first_token(home):
    with (FakeLLM(reply_fn=_device_model) as local, FakeLLM(reply_fn=_cloud_model) as cloudy,
          HostProcess(HOST, home=home) as host):
        _configure(home, local, cloudy)
        diary_id = json.loads(run_cli(["kb", "list", "--json"], home).stdout)["knowledge_bases"][0]["id"]
        _, events = _stopped_partial(host, 1, ["Diary", "Recipes"], Q1)
    names = [e for e, _ in events]
    assert "provenance" in names and "token" in names, names
    assert names.index("provenance") < names.index("token")
    said = events[names.index("provenance")][1]["kbs"]
    assert diary_id in said  # what a turn stopped mid-stream carries as its ``kbs``


def test_host_a_stopped_cloud_answer_continues_on_the_cloud_model_with_its_provenance(home):
    with (FakeLLM(reply_fn=_device_model) as local, FakeLLM(reply_fn=_cloud_model) as cloudy,
          HostProcess(HOST, home=home) as host):
        _configure(home, local, cloudy)
        recipes_id = json.loads(run_cli(["kb", "list", "--json"], home).stdout)["knowledge_bases"][1]["id"]
        partial = "Tomato soup simmers for"
        result = _chat_extra(host, 1, ["Recipes"], Q2, "cloudy",
                             {"continue_from": partial, "continue_kbs": [recipes_id]})
        sent = _received(cloudy)
    assert partial in sent  # allowed: it came from a cloud knowledge base
    assert result["answer"].startswith(partial)
    assert recipes_id in result["kbs"]


def _chat_extra(host: HostProcess, rid: int, kbs: list[str], message: str, endpoint: str,
                extra: dict) -> dict:
    reply = host.request({"id": rid, "type": "chat", "data": {
        "kbs": kbs, "message": message, "history": [], "endpoint": endpoint, **extra}}, timeout=300)
    assert reply["ok"], reply
    return reply["result"]
