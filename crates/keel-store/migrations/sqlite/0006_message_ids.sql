-- keel schema v6 (SQLite): message ids without AUTOINCREMENT. Messages are
-- never deleted, so the id SQLite picks (the largest so far, plus one) keeps
-- the order they were written in, as before; and an insert no longer
-- updates the sqlite_sequence table, one page less in the WAL per commit.

CREATE TABLE messages_v6 (
    id      INTEGER PRIMARY KEY,
    tenant  TEXT NOT NULL,
    session TEXT NOT NULL,
    run_id  TEXT NOT NULL REFERENCES runs (id),
    body    TEXT NOT NULL
);

INSERT INTO messages_v6 (id, tenant, session, run_id, body)
    SELECT id, tenant, session, run_id, body FROM messages ORDER BY id;

DROP TABLE messages;
ALTER TABLE messages_v6 RENAME TO messages;
CREATE INDEX messages_by_session ON messages (tenant, session, id);
DELETE FROM sqlite_sequence WHERE name = 'messages';
