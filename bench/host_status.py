"""How fast the host answers `status` from a cold start (target: under 300 ms), and its first search.

    python bench/host_status.py [--runs 7]

Each run starts `python -m localkb host` as the browser would, writes one framed
`status` request and times the framed reply. Then, per run, a new host answers a
`search` on a small knowledge base (the repository's samples): the first search after
a cold start loads the model and the indexes, and is timed from the process start and
from the request; a second search on the same host shows the warm cost beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import installed_env, source_tree_start

SAMPLES = Path(__file__).resolve().parents[1] / "samples"


def frame(proc: subprocess.Popen, msg: dict) -> dict:
    body = json.dumps(msg).encode()
    proc.stdin.write(struct.pack("=I", len(body)) + body)
    proc.stdin.flush()
    while True:
        n = struct.unpack("=I", proc.stdout.read(4))[0]
        reply = json.loads(proc.stdout.read(n))
        if "event" not in reply:
            return reply


def first_search(home: str, base: dict[str, str]) -> tuple[float, float, float]:
    """(process start -> first search reply, first search request -> reply, second search) in s."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "localkb", "host"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            env={**base, "LOCALKB_HOME": home})
    t1 = time.perf_counter()
    reply = frame(proc, {"id": 1, "type": "search",
                         "data": {"kbs": ["Docs"], "query": "ERR_4521 disk full"}})
    t2 = time.perf_counter()
    assert reply["ok"] and reply["result"]["statuses"][0]["status"] == "passages", reply
    frame(proc, {"id": 2, "type": "search", "data": {"kbs": ["Docs"], "query": "warranty of SKU-88-A"}})
    t3 = time.perf_counter()
    proc.stdin.close()
    proc.wait(timeout=30)
    return t2 - t0, t2 - t1, t3 - t2


def one(home: str, base: dict[str, str]) -> tuple[float, dict]:
    body = json.dumps({"id": 1, "type": "status", "data": {}}).encode()
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "localkb", "host"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            env={**base, "LOCALKB_HOME": home})
    proc.stdin.write(struct.pack("=I", len(body)) + body)
    proc.stdin.flush()
    n = struct.unpack("=I", proc.stdout.read(4))[0]
    reply = json.loads(proc.stdout.read(n))
    elapsed = time.perf_counter() - t0
    proc.stdin.close()
    proc.wait(timeout=30)
    return elapsed, reply


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    cache = tempfile.TemporaryDirectory()
    installed = installed_env(dict(os.environ), Path(cache.name))
    with tempfile.TemporaryDirectory() as home:
        subprocess.run([sys.executable, "-m", "localkb", "kb", "create", "Docs"], check=True,
                       capture_output=True, env={**os.environ, "LOCALKB_HOME": home})
        times, tree = [], []
        for r in range(args.runs):
            for how in (("installed", "tree") if r % 2 == 0 else ("tree", "installed")):
                t, reply = one(home, installed if how == "installed" else dict(os.environ))
                assert reply["ok"] and reply["result"]["ready"], reply
                (times if how == "installed" else tree).append(t * 1000)
        base = []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-c", "pass"], check=True)
            base.append((time.perf_counter() - t0) * 1000)
    print(f"status from a cold start (as installed): median {statistics.median(times):.0f} ms, "
          f"min {min(times):.0f}, max {max(times):.0f} over {args.runs} runs (target < 300 ms)")
    print(f"  the same from the source tree as this shell runs it ({source_tree_start()}): median "
          f"{statistics.median(tree):.0f} ms, min {min(tree):.0f}, max {max(tree):.0f}")
    print(f"bare interpreter start for comparison: median {statistics.median(base):.0f} ms")
    print(f"model loaded at the reply: {reply['result']['model'].get('loaded')}")
    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "LOCALKB_HOME": home}
        subprocess.run([sys.executable, "-m", "localkb", "kb", "create", "Docs"], check=True,
                       capture_output=True, env=env)
        subprocess.run([sys.executable, "-m", "localkb", "add", "Docs", str(SAMPLES)], check=True,
                       capture_output=True, env=env)
        runs = [first_search(home, installed) for _ in range(args.runs)]
    for label, i in (("first search after a cold host start, from the process start", 0),
                     ("  the same, from the search request (model and indexes load)", 1),
                     ("second search on the same host", 2)):
        ms = [r[i] * 1000 for r in runs]
        print(f"{label}: median {statistics.median(ms):.0f} ms, min {min(ms):.0f}, max {max(ms):.0f}")
    cache.cleanup()


if __name__ == "__main__":
    main()
