#!/usr/bin/env bash
# The real-docs eval on the whole PostgreSQL 15 manual: bench/realdocs.sh pgdocs.
#   bench/pgdocs.sh [--split dev] [localkb eval options]   (PGDOCS_SET, PGDOCS_INDEX)
exec "$(dirname "$0")/realdocs.sh" pgdocs "$@"
