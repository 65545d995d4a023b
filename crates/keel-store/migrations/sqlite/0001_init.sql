-- keel schema v1 (SQLite).
-- JSON columns hold serde_json text; timestamps are RFC 3339 text in UTC.

CREATE TABLE sessions (
    tenant     TEXT NOT NULL,
    key        TEXT NOT NULL,
    created_at TEXT NOT NULL,
    PRIMARY KEY (tenant, key)
) WITHOUT ROWID;

CREATE TABLE runs (
    id              TEXT PRIMARY KEY,
    -- Creation order: the sort key for listing, cursors and history cut-offs.
    ord             INTEGER NOT NULL UNIQUE,
    tenant          TEXT NOT NULL,
    session         TEXT NOT NULL,
    agent           TEXT NOT NULL,
    status          TEXT NOT NULL,
    input           TEXT NOT NULL,
    output          TEXT,
    pending         TEXT,
    steps           INTEGER NOT NULL DEFAULT 0,
    usage           TEXT NOT NULL,
    error           TEXT,
    metadata        TEXT NOT NULL,
    state           TEXT NOT NULL,
    principal       TEXT NOT NULL,
    idempotency_key TEXT,
    last_seq        INTEGER NOT NULL DEFAULT 0,
    created_at      TEXT NOT NULL,
    updated_at      TEXT NOT NULL,
    UNIQUE (tenant, idempotency_key),
    FOREIGN KEY (tenant, session) REFERENCES sessions (tenant, key)
);

CREATE INDEX runs_by_tenant ON runs (tenant, ord DESC);
CREATE INDEX runs_by_session ON runs (tenant, session, ord DESC);
CREATE INDEX runs_by_status ON runs (tenant, status, ord DESC);
CREATE INDEX runs_unfinished ON runs (ord)
    WHERE status NOT IN ('completed', 'failed', 'cancelled');

CREATE TABLE messages (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant  TEXT NOT NULL,
    session TEXT NOT NULL,
    run_id  TEXT NOT NULL REFERENCES runs (id),
    body    TEXT NOT NULL
);

CREATE INDEX messages_by_session ON messages (tenant, session, id);

CREATE TABLE events (
    run_id TEXT NOT NULL REFERENCES runs (id),
    seq    INTEGER NOT NULL,
    type   TEXT NOT NULL,
    body   TEXT NOT NULL,
    ts     TEXT NOT NULL,
    PRIMARY KEY (run_id, seq)
) WITHOUT ROWID;
