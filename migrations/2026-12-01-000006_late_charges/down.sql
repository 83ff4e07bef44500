ALTER TABLE payments DROP CONSTRAINT payments_check_only_when_watched;
UPDATE payments SET next_check_at = NULL WHERE status = 'failed';
ALTER TABLE payments ADD CONSTRAINT payments_check_only_when_watched
    CHECK (next_check_at IS NULL OR status IN ('processing', 'requires_capture'));
ALTER TABLE payments DROP COLUMN late_charge_amount, DROP COLUMN late_watch_until;
