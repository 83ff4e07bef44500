-- Our books follow the provider's money.

-- What is captured never exceeds what was authorized: the capture's amount comes from the
-- provider's answer, and this backs the guards that check it (a violation is a guard's bug).
ALTER TABLE payments ADD CONSTRAINT payments_captured_within_amount CHECK (amount_captured <= amount);

-- A refund given up on (the provider never received it, its last send quiet long enough) is
-- watched until `late_watch_until` in case the provider carries it out late: then it is
-- recorded as succeeded after all (a documented correction). `absent_since`: when the watch
-- first found the provider holding no refund for it (or a failed one): from then on it is known
-- not carried out so far, and the system may start another refund of a late charge.
ALTER TABLE refunds
    ADD COLUMN late_watch_until timestamptz,
    ADD COLUMN absent_since timestamptz;
ALTER TABLE refunds DROP CONSTRAINT refunds_check;
ALTER TABLE refunds
    ADD CONSTRAINT refunds_in_flight_checked CHECK (status <> 'processing' OR next_check_at IS NOT NULL),
    ADD CONSTRAINT refunds_checked_only_when_watched CHECK (next_check_at IS NULL
        OR status = 'processing' OR (status = 'failed' AND late_watch_until IS NOT NULL));
CREATE INDEX refunds_watched ON refunds (next_check_at) WHERE status = 'failed' AND next_check_at IS NOT NULL;

-- A provider webhook whose object disagreed with the operation it names (another charge, another
-- currency, another amount) is recorded as such; the provider's own word, asked by a lookup, is
-- what moves the operation.
ALTER TABLE provider_webhooks DROP CONSTRAINT provider_webhooks_result_check;
ALTER TABLE provider_webhooks ADD CONSTRAINT provider_webhooks_result_check
    CHECK (result IN ('received', 'applied', 'stale', 'unknown', 'mismatch'));
