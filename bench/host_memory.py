"""Peak memory of the real host under hostile input: what a malicious or broken page can cost.

    python bench/host_memory.py

Starts ``python -m localkb host`` on a fresh data dir and prints its VmHWM (peak resident set,
from /proc) after each stage: a cold ``status``; one 63 MiB frame of ``{},{},...``; 50
``kb.import`` begins; 300 ``search`` requests of 1 MiB queued behind four ``source.add`` of
4 MiB pages (then cancelled); the 2,200-frame fuzz of tests/test_host.py. Memory, not time: the figures do not
depend on how loaded the machine is. Run the same against another checkout with
``PYTHONPATH=<checkout>/host`` to compare.
"""

from __future__ import annotations

import json
import random
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from hostproc import HostProcess
from test_host import _fuzz_payloads


def hwm_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def drain(host: HostProcess, ids: set) -> dict[str, int]:
    codes: dict[str, int] = {}
    while ids:
        msg = host.next_message(timeout=600)
        if "ok" in msg and msg.get("id") in ids:
            ids.discard(msg["id"])
            code = "ok" if msg["ok"] else msg["error"]["code"]
            codes[code] = codes.get(code, 0) + 1
    return codes


def drain_one(host: HostProcess, ids: set) -> dict[str, int]:
    while True:
        msg = host.next_message(timeout=600)
        if "ok" in msg and msg.get("id") in ids:
            return {"ok" if msg["ok"] else msg["error"]["code"]: 1}


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        with HostProcess([sys.executable, "-m", "localkb", "host"], home=home) as host:
            pid = host.proc.pid
            assert host.request({"id": "s", "type": "status", "data": {}})["ok"]
            assert host.request({"id": "c", "type": "kb.create", "data": {"name": "Docs"}})["ok"]
            assert host.request({"id": "f", "type": "kb.create",
                                 "data": {"name": "Fast", "model": "hashing-256"}})["ok"]
            print(f"{'stage':58} {'peak RSS MiB':>12}  replies")
            print(f"{'cold status + kb.create':58} {hwm_mib(pid):12.0f}")
            body = (b'{"id": "bomb", "type": "search", "data": {"kbs": ["Docs"], "query": ['
                    + b"{}," * (21 * 1024 * 1024) + b"{}]}}")
            host.send_body(body)
            codes = drain_one(host, {None, "bomb"})  # refused before its id is read (or parsed)
            print(f"{'one 63 MiB frame of {},{},...':58} {hwm_mib(pid):12.0f}  {codes}")
            for i in range(50):
                host.send({"id": f"u{i}", "type": "kb.import", "data": {"action": "begin"}})
            codes = drain(host, {f"u{i}" for i in range(50)})
            print(f"{'50 kb.import begins':58} {hwm_mib(pid):12.0f}  {codes}")
            # Four saves keep the workers busy (a fast model, so the bench does not embed for
            # an hour) while 300 requests of 1 MiB each queue behind them; then the saves are
            # cancelled.
            page = "Turbine maintenance notes about valve V-12. " * (4 * 1024 * 1024 // 44)
            for i in range(4):
                host.send({"id": f"a{i}", "type": "source.add", "data": {
                    "kb": "Fast", "url": f"https://b.test/{i}", "title": "Big", "text": page}})
            blob = "x" * (1024 * 1024)
            for i in range(300):
                host.send({"id": f"q{i}", "type": "search",
                           "data": {"kbs": ["Docs"], "query": "valve", "pad": blob}})
            for i in range(4):
                host.send({"id": f"x{i}", "type": "cancel", "data": {"target": f"a{i}"}})
            codes = drain(host, {f"a{i}" for i in range(4)} | {f"q{i}" for i in range(300)})
            print(f"{'300 x 1 MiB requests queued behind 4 saves of 4 MiB':58} {hwm_mib(pid):12.0f}  "
                  f"{codes}")
            payloads = _fuzz_payloads(random.Random(4521), 2200)
            for p in payloads:
                host.send_body(p)
            host.send({"id": "last", "type": "status", "data": {}})
            while host.next_message(timeout=600).get("id") != "last":
                pass
            print(f"{'the 2,200-frame fuzz of tests/test_host.py':58} {hwm_mib(pid):12.0f}")
            print(json.dumps({"peak_rss_mib": round(hwm_mib(pid))}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
