-- keel schema v3 (SQLite): the run ownership columns of the PostgreSQL
-- schema, so both keep one logical shape. A SQLite store has one node, which
-- owns every run; these stay empty.

ALTER TABLE runs ADD COLUMN owner TEXT;
ALTER TABLE runs ADD COLUMN lease_until TEXT;

CREATE TABLE run_commands (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id     TEXT NOT NULL REFERENCES runs (id),
    body       TEXT NOT NULL,
    created_at TEXT NOT NULL
);
