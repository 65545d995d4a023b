-- Search results need each chunk's document source and date. Read from the
-- document row, they cost a walk past the whole document text (stored
-- before `created_at`, in overflow pages); this covering index holds them
-- on their own.
CREATE INDEX memory_documents_meta ON memory_documents (id, source, created_at);
