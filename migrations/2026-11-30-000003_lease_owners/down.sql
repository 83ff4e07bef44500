DROP INDEX idempotency_keys_in_progress;
ALTER TABLE idempotency_keys DROP COLUMN lease_id;
