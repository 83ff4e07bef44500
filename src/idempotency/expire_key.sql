-- Expires one key if it is past its retention (a key met there counts as new); then
-- move_to_audit.sql. Parameters: 1 account, 2 key, 3 now.
WITH doomed AS (
    SELECT account_id, key FROM idempotency_keys
    WHERE account_id = $1 AND key = $2 AND expires_at <= $3 FOR UPDATE
),
