-- General admission: how many places of a show are sold. The ledger's conditional update for a
-- quantity is `ga_sold + n <= ga_quantity`, the counterpart of `status = 'AVAILABLE'` for seats.
ALTER TABLE shows ADD COLUMN IF NOT EXISTS ga_sold INTEGER NOT NULL DEFAULT 0
    CHECK (ga_sold >= 0 AND (ga_quantity IS NULL OR ga_sold <= ga_quantity));
