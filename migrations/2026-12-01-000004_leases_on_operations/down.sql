DROP INDEX payments_leased;
ALTER TABLE idempotency_keys
    ADD COLUMN state text NOT NULL DEFAULT 'completed' CHECK (state IN ('in_progress', 'completed')),
    ADD COLUMN locked_until timestamptz,
    ADD COLUMN recovery_point text NOT NULL DEFAULT 'started',
    ADD COLUMN lease_id uuid;
UPDATE idempotency_keys SET state = 'in_progress' WHERE response_status IS NULL;
ALTER TABLE idempotency_keys DROP COLUMN resource_kind, ALTER COLUMN resource_id DROP NOT NULL;
CREATE INDEX idempotency_keys_in_progress ON idempotency_keys (locked_until) WHERE state = 'in_progress';
ALTER TABLE payments
    DROP COLUMN lease_until, DROP COLUMN lease_id, DROP COLUMN last_send_at,
    DROP COLUMN answer_status, DROP COLUMN answer_body;
