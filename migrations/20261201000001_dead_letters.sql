-- Messages the ledger could not apply and set aside instead of stalling on them: not a booking
-- (unreadable, out of bounds), not signed by the service, or refused by PostgreSQL itself (an
-- unknown show, say). One row per topic offset; an operator reads them here (and the
-- WaitroomDeadLetters alert says there are new ones).
CREATE TABLE IF NOT EXISTS dead_letters (
    topic        TEXT NOT NULL,
    kafka_partition INTEGER NOT NULL,
    kafka_offset BIGINT NOT NULL,
    booking_id   TEXT,
    reason       TEXT NOT NULL,
    payload      BYTEA,
    at           TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (topic, kafka_partition, kafka_offset)
);
