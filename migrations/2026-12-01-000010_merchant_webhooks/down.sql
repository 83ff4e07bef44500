DELETE FROM idempotency_keys WHERE resource_kind = 'webhook_endpoint';
ALTER TABLE idempotency_keys DROP CONSTRAINT idempotency_keys_resource_kind_check;
ALTER TABLE idempotency_keys ADD CONSTRAINT idempotency_keys_resource_kind_check
    CHECK (resource_kind IN ('order', 'payment', 'payment_operation', 'refund'));
DROP TABLE webhook_delivery_attempts;
DROP TABLE webhook_deliveries;
DROP TABLE webhook_endpoints;
