-- keel schema v4 (SQLite): chat-channel messages already taken in, so a
-- message a channel delivers twice (its retries, or two nodes at once) is
-- acted on once.

CREATE TABLE channel_messages (
    tenant      TEXT NOT NULL,
    channel     TEXT NOT NULL,
    message_id  TEXT NOT NULL,
    received_at TEXT NOT NULL,
    PRIMARY KEY (tenant, channel, message_id)
);
