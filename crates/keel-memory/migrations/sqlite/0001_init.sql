-- Long-term memory, in its own file (memory.db) beside keel.db.
CREATE TABLE memory_documents (
    id          TEXT PRIMARY KEY,
    tenant      TEXT NOT NULL,
    agent       TEXT NOT NULL,
    source      TEXT NOT NULL,
    title       TEXT NOT NULL,
    text        TEXT NOT NULL,
    created_at  TEXT NOT NULL,
    updated_at  TEXT NOT NULL,
    UNIQUE (tenant, agent, source)
);

CREATE TABLE memory_chunks (
    id          INTEGER PRIMARY KEY,
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
    embedding   BLOB,
    UNIQUE (doc_id, ordinal)
);
CREATE INDEX memory_chunks_scope ON memory_chunks (tenant, agent, model);
-- Lets the text search check a hit's tenant and agent without reading the
-- (wide) chunk row.
CREATE INDEX memory_chunks_owner ON memory_chunks (id, tenant, agent);

-- BM25 over chunk text; rowid = memory_chunks.id. Contentless: the text is
-- already in memory_chunks.
CREATE VIRTUAL TABLE memory_fts USING fts5(
    text, content = '', contentless_delete = 1, tokenize = 'porter unicode61'
);

-- Bumped on every write to a (tenant, agent): tells every process holding
-- vectors of that scope in memory that they are stale.
CREATE TABLE memory_scopes (
    tenant   TEXT NOT NULL,
    agent    TEXT NOT NULL,
    version  INTEGER NOT NULL,
    -- Chunks stored in the scope, for estimating how common a term is.
    chunks   INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant, agent)
);
