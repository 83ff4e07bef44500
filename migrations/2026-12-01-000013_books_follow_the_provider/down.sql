ALTER TABLE provider_webhooks DROP CONSTRAINT provider_webhooks_result_check;
ALTER TABLE provider_webhooks ADD CONSTRAINT provider_webhooks_result_check
    CHECK (result IN ('received', 'applied', 'stale', 'unknown'));
DROP INDEX refunds_watched;
ALTER TABLE refunds
    DROP CONSTRAINT refunds_checked_only_when_watched,
    DROP CONSTRAINT refunds_in_flight_checked,
    ADD CONSTRAINT refunds_check CHECK ((status = 'processing') = (next_check_at IS NOT NULL)),
    DROP COLUMN absent_since,
    DROP COLUMN late_watch_until;
ALTER TABLE payments DROP CONSTRAINT payments_captured_within_amount;
