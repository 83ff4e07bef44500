ALTER TABLE payment_events DROP CONSTRAINT payment_events_actor_check;
ALTER TABLE payment_events ADD CONSTRAINT payment_events_actor_check CHECK (actor IN ('request', 'reconciler'));
ALTER TABLE payment_events DROP COLUMN subject, DROP COLUMN subject_id;
ALTER TABLE idempotency_keys DROP CONSTRAINT idempotency_keys_resource_kind_check;
ALTER TABLE idempotency_keys ADD CONSTRAINT idempotency_keys_resource_kind_check CHECK (resource_kind IN ('order', 'payment'));
DROP TABLE refunds;
DROP TABLE payment_operations;
DROP INDEX payments_due;
CREATE INDEX payments_due ON payments (next_check_at) WHERE status = 'processing';
DROP INDEX payments_one_active_per_order;
CREATE UNIQUE INDEX payments_one_active_per_order ON payments (account_id, order_id) WHERE status IN ('processing', 'succeeded');
ALTER TABLE payments
    DROP CONSTRAINT payments_check_only_when_watched,
    DROP CONSTRAINT payments_refunds_within_captured,
    DROP COLUMN authorization_expires_at, DROP COLUMN amount_refunding, DROP COLUMN amount_refunded,
    DROP COLUMN amount_captured, DROP COLUMN capture_method,
    DROP CONSTRAINT payments_status_check;
ALTER TABLE payments ADD CONSTRAINT payments_status_check CHECK (status IN ('processing', 'succeeded', 'failed'));
ALTER TABLE payments ADD CONSTRAINT payments_check CHECK ((status = 'processing') = (next_check_at IS NOT NULL));
ALTER TABLE orders DROP CONSTRAINT orders_status_check;
ALTER TABLE orders ADD CONSTRAINT orders_status_check CHECK (status IN ('pending_payment', 'paid', 'cancelled'));
