-- keel schema v3 (PostgreSQL): run ownership across nodes and run mailboxes
-- (SPEC §10). A run belongs to the node named in `owner` while `lease_until`
-- is in the future; an expired or missing lease makes it claimable.

ALTER TABLE runs ADD COLUMN owner TEXT;
ALTER TABLE runs ADD COLUMN lease_until TIMESTAMPTZ;

CREATE INDEX runs_by_owner ON runs (owner)
    WHERE status NOT IN ('completed', 'failed', 'cancelled');

-- Commands (input, steer, cancel, ...) posted on any node for the run's
-- owner; a row lives until the owner takes it, so one posted while the
-- owner is dying waits for the node that takes the run over.
CREATE TABLE run_commands (
    id         BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id     TEXT NOT NULL REFERENCES runs (id),
    body       JSON NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE INDEX run_commands_by_run ON run_commands (run_id, id);
