-- keel schema v10 (SQLite): the unfinished-runs index tested without an IN list.
--
-- SQLite evaluates a partial index's condition for each row a statement
-- inserts, and for the row before and after an UPDATE that assigns a
-- column the condition reads. For `x NOT IN (...)` with more than two
-- values it first builds a temporary B-tree of the values, once per
-- statement run: a run's insert and each commit that changes its status
-- built one or two, each with a page of its own to allocate and clear.
-- The same test as three comparisons builds nothing. Queries meant to use
-- this index must state the condition in the same form.

DROP INDEX runs_unfinished;
CREATE INDEX runs_unfinished ON runs (ord)
    WHERE status <> 'completed' AND status <> 'failed' AND status <> 'cancelled';
