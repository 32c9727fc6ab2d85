"""How fast the host answers `status` from a cold start (target: under 300 ms).

    python bench/host_status.py [--runs 7]

Each run starts `python -m localkb host` as the browser would, writes one framed
`status` request and times the framed reply. Also prints where import time goes.
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


def one(home: str) -> tuple[float, dict]:
    body = json.dumps({"id": 1, "type": "status", "data": {}}).encode()
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "localkb", "host"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            env={**os.environ, "LOCALKB_HOME": home})
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
    with tempfile.TemporaryDirectory() as home:
        subprocess.run([sys.executable, "-m", "localkb", "kb", "create", "Docs"], check=True,
                       capture_output=True, env={**os.environ, "LOCALKB_HOME": home})
        times = []
        for _ in range(args.runs):
            t, reply = one(home)
            assert reply["ok"] and reply["result"]["ready"], reply
            times.append(t * 1000)
        base = []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-c", "pass"], check=True)
            base.append((time.perf_counter() - t0) * 1000)
    print(f"status from a cold start: median {statistics.median(times):.0f} ms, "
          f"min {min(times):.0f}, max {max(times):.0f} over {args.runs} runs (target < 300 ms)")
    print(f"bare interpreter start for comparison: median {statistics.median(base):.0f} ms")
    print(f"model loaded at the reply: {reply['result']['model'].get('loaded')}")


if __name__ == "__main__":
    main()
