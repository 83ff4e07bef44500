DELETE FROM idempotency_keys WHERE resource_kind = 'dispute_response';
ALTER TABLE idempotency_keys DROP CONSTRAINT idempotency_keys_resource_kind_check;
ALTER TABLE idempotency_keys ADD CONSTRAINT idempotency_keys_resource_kind_check
    CHECK (resource_kind IN ('order', 'payment', 'payment_operation', 'refund', 'webhook_endpoint'));
DROP TABLE dispute_responses;
