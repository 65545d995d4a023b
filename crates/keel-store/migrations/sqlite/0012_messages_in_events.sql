-- keel schema v12 (SQLite): a commit's messages in its events row.
--
-- A tool turn's commit wrote its events row and a row of `messages` with
-- its entry in `messages_by_session`: two more B-trees, whose pages each
-- commit wrote to the WAL and each checkpoint copied back. Now:
--
-- * A commit with events keeps its messages in the `messages` column of
--   its events row, one per line, stored like `body` (LZ4-compressed when
--   that makes it smaller). The session's messages are found through its
--   runs (`runs_by_session`) and their events rows (`events_by_run`).
-- * A commit with messages and no events writes a row of `messages` as
--   before, with `after_event`: the id of the newest events row when it
--   was written. Its messages come after that events row's and before the
--   next one's.
-- * Rows of `messages` written before this version have no `after_event`;
--   every one of them was written before any events row holds messages,
--   so they come first, in the order of their ids.
-- * Archiving a session moves its messages, from both places, into rows
--   of `messages` under the archived session's key, in their order.
--
-- Every message of a session thus has one place in one order: events rows
-- by id (the order SQLite gave them, as they are never deleted), and rows
-- of `messages` by (`after_event`, id). An earlier build would not see the
-- messages in events rows; it refuses this version's file instead.

ALTER TABLE events ADD COLUMN messages TEXT;
ALTER TABLE messages ADD COLUMN after_event INTEGER;
