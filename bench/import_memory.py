"""Peak memory of ``localkb import``: the largest valid archive this run builds, and parse bombs.

    python bench/import_memory.py [--chunks 30000]

Each import runs as its own ``localkb import`` process; its peak resident set is VmHWM from
/proc (getrusage would report a big parent's peak across exec). Prints, for a valid archive of
``--chunks`` passages (hashing-256 vectors, so building it is quick) and for three bombs of the
same family the review found, the file size, its decompressed size, and the peak RSS, against
the stated cap: a valid import peaks at no more than 4x its decompressed text, and a refused
file at no more than a small import plus 64 MiB. Run it against another checkout with
``PYTHONPATH=<checkout>/host`` to compare.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from test_portable import _synthetic

_PEAK = ("import sys\nfrom localkb.cli import main\nrc = main(sys.argv[1:])\n"
         "hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM:')][0].split()[1]\n"
         "print('PEAK', hwm, file=sys.stderr)\nsys.exit(rc)\n")


def peak_mib(path: Path, home: Path) -> tuple[float, str]:
    res = subprocess.run([sys.executable, "-c", _PEAK, "import", str(path)], capture_output=True,
                         text=True, env={**os.environ, "LOCALKB_HOME": str(home)}, check=False)
    peak = [x for x in res.stderr.splitlines() if x.startswith("PEAK ")]
    outcome = "imported" if res.returncode == 0 else res.stderr.strip().splitlines()[0][:70]
    return (int(peak[0].split()[1]) / 1024 if peak else float("nan")), outcome


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunks", type=int, default=30_000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        files: list[tuple[str, bytes]] = []
        valid = _synthetic(args.chunks, per_source=100, words_per_chunk=60, seed=3)
        files.append((f"valid: {args.chunks:,} passages", valid))
        small = _synthetic(200, per_source=100, words_per_chunk=60, seed=4)
        files.append(("valid: 200 passages", small))
        n = 1024 * 1024 * 1024 // 3  # 1 GiB of "{}," from about 1 MiB of gzip
        head = json.dumps({"format": "awkb", "version": 1,
                           "model": {"id": "hashing-256", "dim": 256, "normalised": True},
                           "kb": {"name": "Bomb", "privacy": "device"}})[:-1].encode()
        files.append(("bomb: [{},{},...] (1 GiB of JSON)", gzip.compress(b"[" + b"{}," * n + b"{}]", 9)))
        files.append(("bomb: chunks of empty objects (1 GiB)", gzip.compress(
            head + b', "sources": [], "chunks": [' + b"{}," * n + b"{}]}", 9)))
        files.append(("bomb: one 256 MiB string in a title", gzip.compress(
            head + b', "sources": [{"id": "s", "key": "k", "type": "text", "title": "'
            + b"a" * (256 * 1024 * 1024) + b'"}], "chunks": [], "counts": {}}', 9)))
        print(f"{'file':40} {'gzip MB':>8} {'JSON MB':>8} {'peak RSS MiB':>12}  outcome")
        results = {}
        for label, data in files:
            path = tmp / "f.awkb"
            path.write_bytes(data)
            text_mb = len(gzip.decompress(data)) / 1e6
            peak, outcome = peak_mib(path, tmp / "home")
            results[label] = (peak, text_mb)
            print(f"{label:40} {len(data) / 1e6:8.1f} {text_mb:8.1f} {peak:12.0f}  {outcome}")
        big_peak, big_text = results[f"valid: {args.chunks:,} passages"]
        print(f"largest valid import: peak {big_peak:.0f} MiB for {big_text:.0f} MB of JSON "
              f"({big_peak * 1.048576 / big_text:.2f}x its text; the cap is 4x)")
        small_peak = results["valid: 200 passages"][0]
        worst = max(v[0] for k, v in results.items() if k.startswith("bomb"))
        print(f"worst bomb: {worst:.0f} MiB, {worst - small_peak:+.0f} MiB over a 200-passage import "
              "(the cap is +64 MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
