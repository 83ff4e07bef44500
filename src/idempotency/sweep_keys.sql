-- The sweeper: up to $2 keys past their retention ($1 now), oldest first, skipping rows other
-- transactions hold; then move_to_audit.sql.
WITH doomed AS (
    SELECT account_id, key FROM idempotency_keys WHERE expires_at <= $1
    ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED
),
