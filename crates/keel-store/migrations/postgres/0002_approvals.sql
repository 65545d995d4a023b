-- keel schema v2 (PostgreSQL): pending human approvals (SPEC §4.7).
-- `body` holds the whole serialized record; the columns beside it are for lookups.

CREATE TABLE approvals (
    id         TEXT PRIMARY KEY,
    tenant     TEXT NOT NULL,
    run_id     TEXT NOT NULL REFERENCES runs (id),
    status     TEXT NOT NULL,
    created_at TIMESTAMPTZ NOT NULL,
    body       JSON NOT NULL
);

CREATE INDEX approvals_by_tenant ON approvals (tenant, status, created_at);
