-- Settlement reconciliation: the provider's record of every money movement (its balance
-- transactions) held against the ledger's, window by window (docs/books.md).
--
-- A run compares one window; every provider movement it reads and every ledger movement of the
-- window lands in exactly one item, in one category. An item is unique per provider movement
-- and per ledger movement, so running a window again finds nothing new.
CREATE TABLE settlement_runs (
    id uuid PRIMARY KEY,
    window_start timestamptz NOT NULL,
    window_end timestamptz NOT NULL,
    -- Claimed by the background job (one run per window whatever the number of instances), or
    -- asked for by an operator (`orderpay settlement run`), who may run a window again.
    scheduled boolean NOT NULL,
    started_at timestamptz NOT NULL,
    finished_at timestamptz,
    -- Per category: the count and each side's total per currency (what `settlement run` prints).
    report jsonb,
    CHECK (window_end > window_start)
);
CREATE UNIQUE INDEX settlement_runs_one_scheduled_per_window
    ON settlement_runs (window_start, window_end) WHERE scheduled;

CREATE TABLE settlement_items (
    id uuid PRIMARY KEY,
    -- What the comparison says now, and what the first run found (an exception the other side
    -- later matched keeps `found_as`).
    category text NOT NULL CHECK (category IN ('matched', 'missing_ours', 'missing_provider',
        'amount_mismatch', 'currency_mismatch', 'status_mismatch', 'duplicate_provider')),
    found_as text NOT NULL CHECK (found_as IN ('matched', 'missing_ours', 'missing_provider',
        'amount_mismatch', 'currency_mismatch', 'status_mismatch', 'duplicate_provider')),
    run_id uuid NOT NULL REFERENCES settlement_runs (id),
    -- What the two sides are matched on: the payment (charges, disputes) or refund the movement
    -- is for, the kind of movement, and its rank among that object's movements of that kind.
    object_id uuid,
    movement_class text NOT NULL CHECK (movement_class IN ('charge', 'refund', 'refund_reversal',
        'dispute_withdrawal', 'dispute_reinstatement', 'unknown')),
    rank int,
    -- The provider's side: its balance transaction.
    provider_id text UNIQUE,
    provider_category text,
    provider_amount numeric,
    provider_currency text,
    provider_source text,
    provider_key text,
    provider_created timestamptz,
    -- Our side: the ledger movement (or, for `status_mismatch`, the operation without one).
    account_id uuid,
    ledger_movement_id uuid UNIQUE,
    ours_type text,
    -- Signed as the provider's: what the movement did to the provider balance.
    ours_amount numeric,
    ours_currency text,
    ours_created timestamptz,
    ours_status text,
    resolved_at timestamptz,
    resolution text CHECK (resolution IN ('matched_later', 'acknowledged')),
    note text,
    CHECK (provider_id IS NOT NULL OR ledger_movement_id IS NOT NULL),
    CHECK ((resolved_at IS NULL) = (resolution IS NULL))
);
CREATE INDEX settlement_items_by_object ON settlement_items (object_id, movement_class)
    WHERE object_id IS NOT NULL;
CREATE INDEX settlement_items_open ON settlement_items (category)
    WHERE category <> 'matched' AND resolved_at IS NULL;
CREATE INDEX settlement_items_by_provider_time ON settlement_items (provider_created)
    WHERE provider_created IS NOT NULL;
CREATE INDEX settlement_items_ours_only_by_time ON settlement_items (ours_created)
    WHERE provider_id IS NULL;
