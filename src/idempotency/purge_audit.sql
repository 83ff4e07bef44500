-- Deletes up to $2 audit rows of keys that expired before $1, oldest first, skipping rows other
-- transactions hold.
DELETE FROM idempotency_key_audit WHERE (account_id, key, created_at) IN (
    SELECT account_id, key, created_at FROM idempotency_key_audit WHERE expires_at <= $1
    ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED)
