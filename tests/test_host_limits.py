"""The host's memory and disk are bounded: a frame of many small values is refused before it is
parsed, the queue of waiting requests is bounded in number and bytes, and uploads are bounded in
number, size and disk use. The excess gets a clear code: ``protocol_error``/``too_many_values``,
``host_busy``, ``limit_exceeded``. Peak memory is read from the host's own /proc entry (VmHWM)."""

from __future__ import annotations

import base64
import sys
from pathlib import Path

import pytest

from hostproc import HostProcess, tiny_host_argv
from localkb.errors import HostBusy, LimitExceeded
from localkb.native.host import MAX_QUEUED
from localkb.portable.archive import Uploads

HOST = [sys.executable, "-m", "localkb", "host"]


def vm_hwm_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def test_a_frame_of_small_values_is_refused_before_it_is_parsed(tmp_path):
    body = b'{"id": "bomb", "type": "search", "data": {"kbs": ["Docs"], "query": [' \
        + b"{}," * (21 * 1024 * 1024) + b'{}]}}'
    assert len(body) < 64 * 1024 * 1024
    with HostProcess(HOST, home=tmp_path / "home") as host:
        assert host.request({"id": 1, "type": "status", "data": {}})["ok"]
        base = vm_hwm_kib(host.proc.pid)
        host.send_body(body)
        reply = host.next_message(timeout=300)
        assert reply["ok"] is False and reply["error"]["detail"]["reason"] == "too_many_values", reply
        assert host.request({"id": 2, "type": "status", "data": {}})["ok"]  # still serving
        peak = vm_hwm_kib(host.proc.pid)
    # The frame itself is 63 MiB and its text another copy; parsed it would be ~1.7 GB.
    assert peak - base < 256 * 1024, (base, peak)


def test_the_queue_is_bounded_and_the_excess_is_host_busy(tmp_path):
    n = MAX_QUEUED + 4 + 10  # at most four running and MAX_QUEUED waiting: ten or more too many
    with HostProcess(tiny_host_argv(), home=tmp_path) as host:
        for i in range(n):
            host.send({"id": i, "type": "slow", "data": {"pause": 0.05}})
        busy: set[int] = set()
        while len(busy) < 10:  # the refusals come at once, while the accepted ones run on
            msg = host.next_message()
            if msg.get("ok") is False:
                assert msg["error"]["code"] == "host_busy", msg
                busy.add(msg["id"])
        # On a loaded machine the workers may not have taken four yet, so more than ten can be
        # refused: a refusal read after the first ten is a final reply like the others.
        rest = [i for i in range(n) if i not in busy]
        for i in rest:
            host.send({"id": f"c{i}", "type": "cancel", "data": {"target": i}})
        codes = {i: host.until_reply(i, timeout=120)[-1].get("error", {}).get("code") for i in rest}
    accepted = [i for i, code in codes.items() if code != "host_busy"]
    assert len(accepted) <= 4 + MAX_QUEUED
    assert len(busy) + len(rest) - len(accepted) >= 10
    # Every accepted request was answered (cancelled), none dropped.
    assert {codes[i] for i in accepted} == {"cancelled"}


def test_the_queue_is_bounded_in_bytes(tmp_path):
    big = "x" * (60 * 1024 * 1024)
    with HostProcess(tiny_host_argv(), home=tmp_path) as host:
        for i in range(4):  # occupy the four workers
            host.send({"id": f"w{i}", "type": "slow", "data": {"pause": 0.05}})
        for i in range(5):  # 5 x 60 MiB waiting: the fifth passes 256 MiB
            host.send({"id": i, "type": "echo", "data": {"blob": big}})
        reply = host.until_reply(4, timeout=120)[-1]
        assert reply["error"]["code"] == "host_busy"
        assert reply["error"]["detail"]["limit"] == "queue"
        for i in range(4):
            host.send({"id": f"c{i}", "type": "cancel", "data": {"target": f"w{i}"}})
        for i in range(4):
            assert host.until_reply(i, timeout=120)[-1]["ok"]


def test_uploads_are_bounded_in_number_through_the_host(tmp_path):
    with HostProcess(HOST, home=tmp_path / "home") as host:
        ups = [host.request({"id": i, "type": "kb.import", "data": {"action": "begin"}}) for i in range(6)]
        assert [u["ok"] for u in ups] == [True] * 4 + [False] * 2
        assert ups[4]["error"]["code"] == "host_busy" and ups[4]["error"]["detail"]["limit"] == "uploads"
        first = ups[0]["result"]["upload"]
        assert host.request({"id": 9, "type": "kb.import",
                             "data": {"action": "abort", "upload": first}})["result"]["aborted"]
        assert host.request({"id": 10, "type": "kb.import", "data": {"action": "begin"}})["ok"]
        assert len(list((tmp_path / "home" / "uploads").glob("*.part"))) == 4


def test_uploads_are_bounded_in_disk_use(tmp_path):
    ups = Uploads(tmp_path, max_total=3 * 1024 * 1024, max_bytes=2 * 1024 * 1024)
    a, b = ups.begin(), ups.begin()
    ups.part(a, 0, b"a" * (2 * 1024 * 1024))
    with pytest.raises(LimitExceeded) as err:
        ups.part(b, 0, b"b" * (2 * 1024 * 1024))
    assert err.value.code == "limit_exceeded" and err.value.detail["limit"] == "upload_bytes"
    ups.drop(a)
    assert ups.part(b, 0, b"b" * (2 * 1024 * 1024))["bytes"] == 2 * 1024 * 1024
    full = Uploads(tmp_path / "x", min_free=10**18)  # a disk that is always "nearly full"
    c = full.begin()
    with pytest.raises(LimitExceeded) as err:
        full.part(c, 0, base64.b64decode("AAAA"))
    assert err.value.detail["limit"] == "disk_free"
    idle = Uploads(tmp_path / "y", max_open=1, idle_seconds=0.0)
    idle.begin()
    idle.begin()  # the first had no part for idle_seconds: its slot was freed
    with pytest.raises(HostBusy):
        Uploads(tmp_path / "z", max_open=1).begin() and Uploads(tmp_path / "z", max_open=0).begin()
