#!/usr/bin/env bash
# SciFact (BEIR) retrieval eval: vector, keyword and hybrid nDCG@10 and friends.
# Published reference points: all-MiniLM-L6-v2 vector 0.645 (MTEB), BM25 0.665 (BEIR).
# --record: also append what it printed, dated, to RESULTS.md's bench log (bench/_common.py).
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
data="${SCIFACT:-$here/../shared/datasets/beir-scifact}"
py="$here/.venv/bin/python"
[ -x "$py" ] || py=python3
args=()
record=0
for a in "$@"; do
  if [ "$a" = --record ]; then record=1; else args+=("$a"); fi
done
if [ "$record" = 0 ]; then
  exec "$py" -m localkb eval "$data" --baseline bm25 "${args[@]}"
fi
printed="$(mktemp)"
trap 'rm -f "$printed"' EXIT
"$py" -m localkb eval "$data" --baseline bm25 "${args[@]}" | tee "$printed"
"$py" "$here/bench/_common.py" record "$printed" bench/scifact.sh "$@"
