"""The team database's schema, applied as numbered migrations (each one in its own transaction).

Knowledge bases, sources and passages mirror the local catalogue, plus what sharing
needs: every source and each of its passages carries an access level (denormalised
onto the passage so both retrieval legs filter on it inside their own query), users,
roles with a clearance, grants of knowledge bases to roles, and API tokens stored as
SHA-256 digests. Passages carry their vector (pgvector, one HNSW index per dimension,
partial on ``dim``) and a ``tsvector`` of our own analyser's terms under a GIN index.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the LEVELS are read without the team extra (the CLI's parser lists them)
    import psycopg

#: Access levels, lowest first. A role's clearance is one of them; a passage is visible to a
#: role granted its knowledge base when its level is at or below the role's clearance.
LEVELS = ("public", "internal", "confidential", "secret")

MIGRATIONS: Sequence[tuple[int, str, str]] = (
    (1, "knowledge bases, sources, passages", """
CREATE EXTENSION IF NOT EXISTS vector;
CREATE TABLE kbs (
    id text PRIMARY KEY,
    name text NOT NULL,
    privacy text NOT NULL CHECK (privacy IN ('device', 'cloud')),
    model text NOT NULL,
    dim integer NOT NULL CHECK (dim BETWEEN 1 AND 2000),
    created double precision NOT NULL,
    generation bigint NOT NULL DEFAULT 0,
    default_access smallint NOT NULL DEFAULT 0 CHECK (default_access BETWEEN 0 AND 3)
);
CREATE UNIQUE INDEX kbs_name ON kbs (lower(name));
CREATE TABLE sources (
    id text PRIMARY KEY,
    kb_id text NOT NULL REFERENCES kbs(id) ON DELETE CASCADE,
    key text NOT NULL,
    type text NOT NULL,
    title text NOT NULL,
    url text,
    file_name text,
    content_hash text NOT NULL,
    captured_by text NOT NULL,
    chunk_count integer NOT NULL,
    pages integer,
    lang text,
    added_at double precision NOT NULL,
    updated_at double precision NOT NULL,
    access_level smallint NOT NULL CHECK (access_level BETWEEN 0 AND 3),
    added_by text,
    UNIQUE (kb_id, key)
);
CREATE TABLE chunks (
    id text PRIMARY KEY,
    vkey bigint NOT NULL,
    kb_id text NOT NULL REFERENCES kbs(id) ON DELETE CASCADE,
    source_id text NOT NULL REFERENCES sources(id) ON DELETE CASCADE,
    idx integer NOT NULL,
    text text NOT NULL,
    text_hash text NOT NULL,
    page integer,
    tokens integer NOT NULL,
    dim integer NOT NULL,
    embedding vector NOT NULL,
    access_level smallint NOT NULL CHECK (access_level BETWEEN 0 AND 3),
    tsv tsvector NOT NULL,
    kw_len integer NOT NULL,
    indexed_by text NOT NULL,
    indexed_at double precision NOT NULL,
    UNIQUE (kb_id, vkey),
    UNIQUE (source_id, idx)
);
CREATE INDEX chunks_kb_level ON chunks (kb_id, access_level) INCLUDE (kw_len);
CREATE INDEX chunks_source ON chunks (source_id, idx);
CREATE INDEX chunks_tsv ON chunks USING gin (tsv);
CREATE TABLE errors (
    id bigserial PRIMARY KEY,
    at double precision NOT NULL,
    source text NOT NULL,
    code text NOT NULL,
    message text NOT NULL,
    kb_id text,
    ref text,
    detail jsonb
);
"""),
    (2, "users, roles, grants, tokens", """
CREATE TABLE users (
    id text PRIMARY KEY,
    name text NOT NULL,
    is_admin boolean NOT NULL DEFAULT false,
    created double precision NOT NULL
);
CREATE UNIQUE INDEX users_name ON users (lower(name));
CREATE TABLE roles (
    id text PRIMARY KEY,
    name text NOT NULL,
    clearance smallint NOT NULL CHECK (clearance BETWEEN 0 AND 3),
    created double precision NOT NULL
);
CREATE UNIQUE INDEX roles_name ON roles (lower(name));
CREATE TABLE user_roles (
    user_id text NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    role_id text NOT NULL REFERENCES roles(id) ON DELETE CASCADE,
    PRIMARY KEY (user_id, role_id)
);
CREATE TABLE grants (
    role_id text NOT NULL REFERENCES roles(id) ON DELETE CASCADE,
    kb_id text NOT NULL REFERENCES kbs(id) ON DELETE CASCADE,
    can_write boolean NOT NULL DEFAULT false,
    PRIMARY KEY (role_id, kb_id)
);
CREATE TABLE tokens (
    id text PRIMARY KEY,
    user_id text NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    name text NOT NULL,
    digest bytea NOT NULL,
    created double precision NOT NULL,
    last_used double precision,
    revoked double precision
);
CREATE INDEX tokens_user ON tokens (user_id);
"""),
    (3, "re-embedding staging", """
CREATE TABLE reembed_staging (
    kb_id text NOT NULL REFERENCES kbs(id) ON DELETE CASCADE,
    chunk_id text NOT NULL,
    model text NOT NULL,
    text_hash text NOT NULL,
    embedding vector NOT NULL,
    PRIMARY KEY (kb_id, chunk_id)
);
"""),
    (4, "database facts (the keyword analysis the tsvectors were written with)", """
CREATE TABLE meta (
    key text PRIMARY KEY,
    value text NOT NULL
);
"""),
    (5, "ingest: staged passages of big sources, file fingerprints", """
CREATE TABLE ingest_staging (
    kb_id text NOT NULL REFERENCES kbs(id) ON DELETE CASCADE,
    source_id text NOT NULL,
    idx integer NOT NULL,
    chunk_id text NOT NULL,
    model text NOT NULL,
    text text NOT NULL,
    text_hash text NOT NULL,
    page integer,
    tokens integer NOT NULL,
    embedding vector NOT NULL,
    staged_at double precision NOT NULL,
    PRIMARY KEY (source_id, idx)
);
CREATE INDEX ingest_staging_kb ON ingest_staging (kb_id, source_id);
CREATE TABLE source_files (
    source_id text PRIMARY KEY REFERENCES sources(id) ON DELETE CASCADE,
    kb_id text NOT NULL,
    path text NOT NULL,
    size bigint NOT NULL,
    mtime_ns bigint NOT NULL,
    sha256 text NOT NULL,
    recipe text NOT NULL
);
CREATE INDEX chunks_text_hash ON chunks (kb_id, text_hash);
CREATE INDEX errors_ref ON errors (kb_id, ref, id);
"""),
    # Numbered after the issue that added it, so the team server's own later migrations
    # (4, 5, ...) never collide with it; migrations run in this order whatever their numbers.
    (20, "team chat: query log, daily rate counters", """
CREATE TABLE query_log (
    id bigserial PRIMARY KEY,
    at double precision NOT NULL,
    user_id text,
    user_name text NOT NULL,
    address text,
    kind text NOT NULL,
    query text NOT NULL,
    access jsonb NOT NULL,
    kbs jsonb NOT NULL,
    outcome text NOT NULL,
    error_code text,
    cache text,
    stages jsonb NOT NULL,
    rerank jsonb,
    citations jsonb NOT NULL,
    model jsonb,
    total_ms double precision NOT NULL
);
CREATE INDEX query_log_user ON query_log (user_id, id);
CREATE TABLE rate_counts (
    scope text NOT NULL,
    key text NOT NULL,
    day date NOT NULL,
    count integer NOT NULL,
    PRIMARY KEY (scope, key, day)
);
"""),
    # A writer's add at the URL of a source above their clearance makes a source of their own
    # there (``TeamKnowledgeBase.source_id_for``), so one key may have several sources.
    (37, "sources: several at one key, one per clearance that wrote it", """
ALTER TABLE sources DROP CONSTRAINT sources_kb_id_key_key;
CREATE INDEX sources_kb_key ON sources (kb_id, key);
"""),
    # Caps every server reads on every request (``limits.RateLimiter``), and per-minute
    # counters beside the daily ones (rows older than an hour are swept as new ones start).
    (40, "caps in the database; per-minute rate windows", """
CREATE TABLE caps (
    name text PRIMARY KEY,
    value integer NOT NULL CHECK (value >= 0),
    updated_at double precision NOT NULL
);
CREATE TABLE rate_windows (
    scope text NOT NULL,
    key text NOT NULL,
    window_start timestamptz NOT NULL,
    count integer NOT NULL,
    PRIMARY KEY (scope, key, window_start)
);
CREATE INDEX rate_windows_start ON rate_windows (window_start);
"""),
    # Several servers on one database: each query-log row names the process that answered it.
    (41, "operability: the answering instance on each query-log row, an audit log", """
ALTER TABLE query_log ADD COLUMN instance text;
CREATE TABLE audit_log (
    id bigserial PRIMARY KEY,
    at double precision NOT NULL,
    actor text NOT NULL,
    action text NOT NULL,
    target text NOT NULL,
    detail jsonb NOT NULL,
    instance text
);
"""),
)


def hnsw_index_sql(dim: int) -> str:
    """The HNSW index for one vector dimension (partial: pgvector indexes one dimension each)."""
    dim = int(dim)  # an int from a checked column, never text from a request
    return (f"CREATE INDEX IF NOT EXISTS chunks_hnsw_{dim} ON chunks USING hnsw "
            f"((embedding::vector({dim})) vector_cosine_ops) WITH (m = 16, ef_construction = 128) "
            f"WHERE dim = {dim}")


def migrate(conn: psycopg.Connection) -> list[int]:
    """Apply every migration this database lacks, in order; the versions applied now."""
    conn.execute("CREATE TABLE IF NOT EXISTS migrations (version integer PRIMARY KEY, "
                 "name text NOT NULL, applied double precision NOT NULL)")
    conn.commit()
    newest = schema_version(conn)
    conn.commit()
    known = max(v for v, _, _ in MIGRATIONS)
    if newest > known:
        from localkb.errors import SchemaTooNew

        raise SchemaTooNew(f"the team database has schema version {newest}, newer than this release's "
                           f"{known}: run the release that migrated it (or newer)",
                           detail={"database": newest, "code": known})
    applied = []
    for version, name, sql in MIGRATIONS:
        with conn.transaction():
            # One migrator at a time, even with several servers starting on one database.
            conn.execute("SELECT pg_advisory_xact_lock(72190001)")
            if conn.execute("SELECT 1 FROM migrations WHERE version = %s", (version,)).fetchone():
                continue
            conn.execute(sql)
            conn.execute("INSERT INTO migrations VALUES (%s, %s, extract(epoch from now()))",
                         (version, name))
            applied.append(version)
    return applied


def schema_version(conn: psycopg.Connection) -> int:
    row = conn.execute("SELECT max(version) FROM migrations").fetchone()
    return int(row[0] or 0)


def check_server(conn: psycopg.Connection) -> dict:
    """PostgreSQL >= 15 and pgvector >= 0.8 (iterative index scans), or a clear refusal."""
    from localkb.errors import TeamUnavailable

    num = int(conn.execute("SHOW server_version_num").fetchone()[0])
    row = conn.execute("SELECT default_version FROM pg_available_extensions WHERE name = 'vector'"
                       ).fetchone()
    if num < 150000:
        raise TeamUnavailable(f"PostgreSQL {num // 10000} is too old: the team store needs 15 or newer")
    if row is None:
        raise TeamUnavailable("the pgvector extension is not installed on this PostgreSQL server")
    parts = tuple(int(p) for p in row[0].split(".")[:2])
    if parts < (0, 8):
        raise TeamUnavailable(f"pgvector {row[0]} is too old: the team store needs 0.8 or newer "
                              "(iterative index scans)")
    return {"postgres": num, "pgvector": row[0]}
