-- A charge that lands after its payment was given up on is never kept. The reconciler keeps
-- looking up a given-up payment's downstream key until `late_watch_until`; a charge it finds is
-- recorded here and refunded by the system (a refund with no client key). The failed payment
-- stays failed.
ALTER TABLE payments
    ADD COLUMN late_watch_until timestamptz,
    -- What a late charge took (and what its system refund gives back).
    ADD COLUMN late_charge_amount numeric(19,4) CHECK (late_charge_amount > 0);

ALTER TABLE payments DROP CONSTRAINT payments_check_only_when_watched;
ALTER TABLE payments ADD CONSTRAINT payments_check_only_when_watched
    CHECK (next_check_at IS NULL OR status IN ('processing', 'requires_capture')
        OR (status = 'failed' AND late_watch_until IS NOT NULL));
