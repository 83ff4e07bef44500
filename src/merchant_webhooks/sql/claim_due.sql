-- Leases up to $2 deliveries due by $1 to lease $3 until $4 (skipping rows another worker is
-- claiming, oldest due first), counting an attempt each, and returns with each claimed delivery
-- everything its send needs: the endpoint's address and secrets (the previous one while it still
-- signs) and the event (NULL once gone past its retention). Columns in `Claimed`'s order.
WITH due AS (
    SELECT account_id, id FROM webhook_deliveries
    WHERE status = 'pending' AND next_attempt_at <= $1
    ORDER BY next_attempt_at LIMIT $2 FOR UPDATE SKIP LOCKED),
claimed AS (
    UPDATE webhook_deliveries AS d SET attempts = d.attempts + 1, lease_id = $3,
        lease_until = $4, next_attempt_at = $4, updated_at = $1
    FROM due WHERE d.account_id = due.account_id AND d.id = due.id
    RETURNING d.account_id, d.id, d.endpoint_id, d.event_id, d.attempts)
SELECT c.account_id, c.id, c.endpoint_id, c.event_id, c.attempts, e.url,
    e.secret, CASE WHEN e.previous_secret_expires_at > $1 THEN e.previous_secret END,
    ev.type, ev.data, ev.created_at
FROM claimed AS c
JOIN webhook_endpoints AS e ON e.account_id = c.account_id AND e.id = c.endpoint_id
LEFT JOIN events AS ev ON ev.account_id = c.account_id AND ev.id = c.event_id
