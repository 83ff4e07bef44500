-- Deletes up to $2 finished deliveries (not pending) created before $1, with their attempts,
-- skipping rows another purge holds. Returns nothing; the row count is the deliveries deleted.
WITH doomed AS (
    SELECT account_id, id FROM webhook_deliveries
    WHERE created_at < $1 AND status <> 'pending'
    LIMIT $2 FOR UPDATE SKIP LOCKED
), attempts AS (
    DELETE FROM webhook_delivery_attempts a USING doomed d
    WHERE a.account_id = d.account_id AND a.delivery_id = d.id
)
DELETE FROM webhook_deliveries w USING doomed d
WHERE w.account_id = d.account_id AND w.id = d.id
