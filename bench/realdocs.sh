#!/usr/bin/env bash
# The real-docs evals, relevance from each manual's own index, every mode against plain
# whole-page BM25 (--baseline bm25), identifier and concept queries plus absent names:
#   pgdocs: the PostgreSQL 15 manual (Debian's postgresql-doc-15), 1,168 pages
#   pydocs: Python 3.11's library reference (Debian's python3.11-doc), 317 pages
# The set is built once into a cache folder, the index once beside it.
#   bench/realdocs.sh pgdocs|pydocs [--split dev] [localkb eval options]
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
py="$here/.venv/bin/python"
[ -x "$py" ] || py=python3
name="${1:?usage: bench/realdocs.sh pgdocs|pydocs [localkb eval options]}"
shift
case "$name" in
  pgdocs) src=(--manual "${PGDOCS_MANUAL:-/usr/share/doc/postgresql-doc-15/html}")
          set_dir="${PGDOCS_SET:-${TMPDIR:-/tmp}/localkb-pgdocs}"; index="${PGDOCS_INDEX:-}" ;;
  pydocs) src=(--docs "${PYDOCS_DOCS:-/usr/share/doc/python3.11/html}")
          set_dir="${PYDOCS_SET:-${TMPDIR:-/tmp}/localkb-pydocs}"; index="${PYDOCS_INDEX:-}" ;;
  *) echo "unknown set: $name (pgdocs or pydocs)" >&2; exit 2 ;;
esac
if [ ! -f "$set_dir/corpus.jsonl" ]; then
  "$py" "$here/evals/$name/build.py" "$set_dir" "${src[@]}"
fi
exec "$py" -m localkb eval "$set_dir" --baseline bm25 --index-dir "${index:-$set_dir.index}" "$@"
