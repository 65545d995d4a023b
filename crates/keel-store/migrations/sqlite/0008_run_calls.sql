-- keel schema v8 (SQLite): loop detection's call records in a table of
-- their own. Up to v7 they were part of the run's `state`, rewritten whole
-- with every commit: about 120 bytes per call, so past some 30 calls the
-- row outgrew its page and every commit also freed and wrote its overflow
-- pages. A commit now appends only its new records. Each key starts with a
-- time-ordered run id, so a live run's records go at the end of the table.
-- A run stored by an earlier version keeps its records in its state until
-- its next commit moves them here.

CREATE TABLE run_calls (
    run_id TEXT NOT NULL REFERENCES runs (id),
    n      INTEGER NOT NULL,
    record TEXT NOT NULL,
    PRIMARY KEY (run_id, n)
) WITHOUT ROWID;
