-- keel schema v6 (PostgreSQL): loop detection's call records in a table of
-- their own, appended by each commit, instead of inside the run's `state`,
-- which every commit rewrote whole (about 120 bytes per call of the run).
-- A run stored by an earlier version keeps its records in its state until
-- its next commit moves them here.

CREATE TABLE run_calls (
    run_id TEXT NOT NULL REFERENCES runs (id),
    n      BIGINT NOT NULL,
    record TEXT NOT NULL,
    PRIMARY KEY (run_id, n)
);
