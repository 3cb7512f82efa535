-- The booking ledger: PostgreSQL is the source of truth for what is sold.
-- Redis holds the fast, atomic view (holds, sold marks); this schema is the last line against
-- double selling: a seat moves to SOLD only by a conditional UPDATE ... WHERE status = 'AVAILABLE'.

CREATE TABLE IF NOT EXISTS events (
    event_id    TEXT PRIMARY KEY,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS shows (
    show_id     TEXT PRIMARY KEY,
    event_id    TEXT NOT NULL REFERENCES events (event_id),
    -- NULL for a seated show; the number of places for general admission.
    ga_quantity INTEGER CHECK (ga_quantity IS NULL OR ga_quantity >= 0),
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS bookings (
    booking_id  UUID PRIMARY KEY,
    show_id     TEXT NOT NULL REFERENCES shows (show_id),
    ticket      TEXT NOT NULL,
    seats       TEXT[] NOT NULL DEFAULT '{}',
    quantity    INTEGER NOT NULL DEFAULT 0,
    status      TEXT NOT NULL CHECK (status IN ('pending', 'confirmed', 'rejected')),
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    decided_at  TIMESTAMPTZ
);

CREATE TABLE IF NOT EXISTS seats (
    show_id     TEXT NOT NULL REFERENCES shows (show_id),
    seat_id     TEXT NOT NULL,
    status      TEXT NOT NULL DEFAULT 'AVAILABLE' CHECK (status IN ('AVAILABLE', 'SOLD')),
    booking_id  UUID REFERENCES bookings (booking_id),
    PRIMARY KEY (show_id, seat_id),
    CHECK ((status = 'SOLD') = (booking_id IS NOT NULL))
);

-- The conditional UPDATE looks seats up by (show_id, seat_id) — the primary key — and filters on
-- status; this partial index serves "how many are left" and the reconciliation scan.
CREATE INDEX IF NOT EXISTS seats_available ON seats (show_id) WHERE status = 'AVAILABLE';
CREATE INDEX IF NOT EXISTS bookings_show ON bookings (show_id, status);
