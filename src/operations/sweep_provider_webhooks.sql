-- Deletes up to $2 received provider webhooks received before $1, skipping rows other
-- transactions hold (kept as long as the events).
DELETE FROM provider_webhooks WHERE id IN (
    SELECT id FROM provider_webhooks WHERE received_at < $1 LIMIT $2 FOR UPDATE SKIP LOCKED)
