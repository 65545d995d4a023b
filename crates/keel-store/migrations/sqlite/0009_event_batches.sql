-- keel schema v9 (SQLite): the events of one commit in one row.
--
-- A tool turn commits six or more events at once, and each was a row of
-- its own plus an entry in `events_by_run`: most of the rows and index
-- entries the turn wrote, and under many concurrent runs most of the pages
-- its commit dirtied. A row now holds the events `seq` to `last_seq` of one
-- commit, one JSON object per line in `body` (compact JSON has no raw line
-- breaks). Reads find the rows by `(run_id, last_seq)`: the first row whose
-- last event is past a cursor holds the cursor's next event.

CREATE TABLE events_v9 (
    id       INTEGER PRIMARY KEY,
    run_id   TEXT NOT NULL REFERENCES runs (id),
    seq      INTEGER NOT NULL,
    last_seq INTEGER NOT NULL,
    body     TEXT NOT NULL,
    ts       TEXT NOT NULL
);

INSERT INTO events_v9 (id, run_id, seq, last_seq, body, ts)
    SELECT id, run_id, seq, seq, body, ts FROM events ORDER BY id;

DROP TABLE events;
ALTER TABLE events_v9 RENAME TO events;
CREATE UNIQUE INDEX events_by_run ON events (run_id, last_seq);
