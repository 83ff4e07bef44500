-- The live endpoints of the accounts $1 (only endpoint $2 when it is not NULL), locked FOR SHARE
-- until the transaction ends: a deletion waits for the deliveries written for them.
SELECT account_id, id, url, enabled_events, created_at FROM webhook_endpoints
WHERE account_id = ANY($1) AND deleted_at IS NULL AND ($2::uuid IS NULL OR id = $2)
FOR SHARE
