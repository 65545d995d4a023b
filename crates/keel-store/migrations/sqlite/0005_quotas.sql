-- keel schema v5 (SQLite): tenant quota counters, one row per tenant,
-- limit and period (a UTC minute or day; empty for runs in progress).
-- Rows are changed only by one conditional upsert each, so nodes sharing
-- the database never together pass a limit.

CREATE TABLE quota_counters (
    tenant     TEXT NOT NULL,
    quota      TEXT NOT NULL,
    period     TEXT NOT NULL,
    used       BIGINT NOT NULL CHECK (used >= 0),
    updated_at TEXT NOT NULL,
    PRIMARY KEY (tenant, quota, period)
);

-- The runs holding one of their tenant's max_concurrent_runs slots; the
-- commit that makes a run terminal deletes its row and gives the slot back.
CREATE TABLE quota_run_slots (
    run_id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL
);
