-- Long-term memory, in the same database as the run store.
CREATE TABLE memory_documents (
    id          TEXT PRIMARY KEY,
    tenant      TEXT NOT NULL,
    agent       TEXT NOT NULL,
    source      TEXT NOT NULL,
    title       TEXT NOT NULL,
    text        TEXT NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL,
    updated_at  TIMESTAMPTZ NOT NULL,
    UNIQUE (tenant, agent, source)
);

CREATE TABLE memory_chunks (
    id          BIGSERIAL PRIMARY KEY,
    doc_id      TEXT NOT NULL REFERENCES memory_documents(id) ON DELETE CASCADE,
    tenant      TEXT NOT NULL,
    agent       TEXT NOT NULL,
    ordinal     INTEGER NOT NULL,
    start_line  INTEGER NOT NULL,
    end_line    INTEGER NOT NULL,
    text        TEXT NOT NULL,
    hash        TEXT NOT NULL,
    -- Embedder name and its f32 little-endian vector; NULL when none.
    model       TEXT,
    embedding   BYTEA,
    tsv         TSVECTOR GENERATED ALWAYS AS (to_tsvector('english', text)) STORED,
    UNIQUE (doc_id, ordinal)
);
CREATE INDEX memory_chunks_scope ON memory_chunks (tenant, agent, model);
CREATE INDEX memory_chunks_tsv ON memory_chunks USING GIN (tsv);

-- Bumped on every write to a (tenant, agent): tells every node holding
-- vectors of that scope in memory that they are stale.
CREATE TABLE memory_scopes (
    tenant   TEXT NOT NULL,
    agent    TEXT NOT NULL,
    version  BIGINT NOT NULL,
    -- Chunks stored in the scope, for estimating how common a term is.
    chunks   BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant, agent)
);
