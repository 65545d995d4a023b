-- keel schema v7 (SQLite): events appended in the order they were written.
-- v1 keyed the events table by (run_id, seq) WITHOUT ROWID, so each commit
-- inserted its events in the middle of a B-tree ordered by random run ids.
-- SQLite splits such a page by rebalancing it with its siblings, which wrote
-- about five pages to the WAL per commit of a tool turn (six events). Rows
-- with their own integer key go at the end of the table instead, where a
-- full page is followed by a new one, and only the small index entries land
-- by run: two pages per commit in the common case.

CREATE TABLE events_v7 (
    id     INTEGER PRIMARY KEY,
    run_id TEXT NOT NULL REFERENCES runs (id),
    seq    INTEGER NOT NULL,
    type   TEXT NOT NULL,
    body   TEXT NOT NULL,
    ts     TEXT NOT NULL
);

INSERT INTO events_v7 (run_id, seq, type, body, ts)
    SELECT run_id, seq, type, body, ts FROM events ORDER BY ts, run_id, seq;

DROP TABLE events;
ALTER TABLE events_v7 RENAME TO events;
CREATE UNIQUE INDEX events_by_run ON events (run_id, seq);
