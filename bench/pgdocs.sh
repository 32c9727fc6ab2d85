#!/usr/bin/env bash
# The real-docs eval on the whole PostgreSQL 15 manual (Debian's postgresql-doc-15): relevance
# from the manual's own index, identifier and concept queries plus absent names, every mode
# against plain whole-page BM25. The set is built once into a cache folder.
#   bench/pgdocs.sh [--split dev] [localkb eval options]
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
py="$here/.venv/bin/python"
[ -x "$py" ] || py=python3
manual="${PGDOCS_MANUAL:-/usr/share/doc/postgresql-doc-15/html}"
set_dir="${PGDOCS_SET:-${TMPDIR:-/tmp}/localkb-pgdocs}"
if [ ! -f "$set_dir/corpus.jsonl" ]; then
  "$py" "$here/evals/pgdocs/build.py" "$set_dir" --manual "$manual"
fi
exec "$py" -m localkb eval "$set_dir" --baseline bm25 --index-dir "${PGDOCS_INDEX:-$set_dir.index}" "$@"
