-- keel schema v1 (PostgreSQL); the same logical schema as migrations/sqlite.
-- Structured fields are `json`, not `jsonb`: json keeps the exact text written
-- (so a record reads back equal) and accepts \u0000, which jsonb refuses.

CREATE TABLE sessions (
    tenant     TEXT NOT NULL,
    key        TEXT NOT NULL,
    created_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (tenant, key)
);

CREATE TABLE runs (
    id              TEXT PRIMARY KEY,
    -- Creation order: the sort key for listing, cursors and history cut-offs.
    -- Gaps (from rolled-back creates) are harmless: only the order matters.
    ord             BIGINT GENERATED ALWAYS AS IDENTITY UNIQUE,
    tenant          TEXT NOT NULL,
    session         TEXT NOT NULL,
    agent           TEXT NOT NULL,
    status          TEXT NOT NULL,
    input           TEXT NOT NULL,
    output          TEXT,
    pending         JSON,
    steps           BIGINT NOT NULL DEFAULT 0,
    usage           JSON NOT NULL,
    error           JSON,
    metadata        JSON NOT NULL,
    state           JSON NOT NULL,
    principal       JSON NOT NULL,
    idempotency_key TEXT,
    -- Locked (SELECT ... FOR UPDATE) by every commit: it serializes the
    -- commits of one run, which keeps its event numbering gap-free.
    last_seq        BIGINT NOT NULL DEFAULT 0,
    created_at      TIMESTAMPTZ NOT NULL,
    updated_at      TIMESTAMPTZ NOT NULL,
    UNIQUE (tenant, idempotency_key),
    FOREIGN KEY (tenant, session) REFERENCES sessions (tenant, key)
);

CREATE INDEX runs_by_tenant ON runs (tenant, ord DESC);
CREATE INDEX runs_by_session ON runs (tenant, session, ord DESC);
CREATE INDEX runs_by_status ON runs (tenant, status, ord DESC);
CREATE INDEX runs_unfinished ON runs (ord)
    WHERE status NOT IN ('completed', 'failed', 'cancelled');

CREATE TABLE messages (
    id      BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant  TEXT NOT NULL,
    session TEXT NOT NULL,
    run_id  TEXT NOT NULL REFERENCES runs (id),
    body    JSON NOT NULL
);

CREATE INDEX messages_by_session ON messages (tenant, session, id);

CREATE TABLE events (
    run_id TEXT NOT NULL REFERENCES runs (id),
    seq    BIGINT NOT NULL,
    type   TEXT NOT NULL,
    body   JSON NOT NULL,
    ts     TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (run_id, seq)
);
