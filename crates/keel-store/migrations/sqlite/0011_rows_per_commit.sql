-- keel schema v11 (SQLite): a commit's call records in its events row, and
-- a commit's messages in one row.
--
-- A tool turn's commit wrote a row of `run_calls` (about 120 bytes) and a
-- row of `messages` per message besides its events row; with 2 KiB pages,
-- each of those rows and their index entries cost the commit a page or
-- more of WAL frames, and the checkpoint as much again. Now:
--
-- * The records go in the `calls` column of the commit's events row, one
--   per line: the record's place `n`, a space, the record. `runs.last_call`
--   keeps the place of the run's last record, so that a commit still
--   refuses a place taken already, as the table's key did. A commit with
--   records and no events writes them to `run_calls` as before, and the
--   rows there stay; reads take both.
-- * A commit's messages are one row of `messages`, one per line, stored
--   LZ4-compressed when that makes the row smaller (like an events row's
--   body). Rows holding one message each, as earlier versions wrote them,
--   read as they are. An earlier build would misread the new rows; this
--   version makes it refuse the file instead.

ALTER TABLE events ADD COLUMN calls TEXT;
ALTER TABLE runs ADD COLUMN last_call INTEGER NOT NULL DEFAULT 0;
UPDATE runs SET last_call = (SELECT max(n) FROM run_calls WHERE run_calls.run_id = runs.id)
    WHERE id IN (SELECT run_id FROM run_calls);
