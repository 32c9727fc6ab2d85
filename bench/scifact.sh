#!/usr/bin/env bash
# SciFact (BEIR) retrieval eval: vector, keyword and hybrid nDCG@10 and friends.
# Published reference points: all-MiniLM-L6-v2 vector 0.645 (MTEB), BM25 0.665 (BEIR).
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
data="${SCIFACT:-$here/../shared/datasets/beir-scifact}"
py="$here/.venv/bin/python"
[ -x "$py" ] || py=python3
exec "$py" -m localkb eval "$data" --baseline bm25 "$@"
