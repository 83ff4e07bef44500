-- Records a batch of finished attempts, given as parallel arrays (one element per attempt):
-- account $1, delivery $2, the lease it was sent under $3, attempt number $4, started at $5,
-- HTTP status $6, latency $7, error $8, and the delivery's outcome: status $9, next attempt $10.
-- Every attempt's row is written; a delivery's outcome only while that attempt's lease still
-- holds it pending (held deliveries are locked SKIP LOCKED: whoever else holds one is taking it
-- away). $11 is now. Returns the deliveries whose outcome was written, with their lease.
WITH finished AS (
    SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::uuid[], $4::int4[],
        $5::timestamptz[], $6::int2[], $7::int4[], $8::text[], $9::text[],
        $10::timestamptz[])
    AS f(account_id, id, lease_id, attempt, started_at, http_status, latency_ms, error,
        status, next_attempt_at)),
attempts AS (
    INSERT INTO webhook_delivery_attempts
        (account_id, delivery_id, attempt, started_at, http_status, latency_ms, error)
    SELECT account_id, id, attempt, started_at, http_status, latency_ms, error
    FROM finished ON CONFLICT DO NOTHING),
held AS (
    SELECT d.account_id, d.id FROM webhook_deliveries AS d
    JOIN finished AS f ON d.account_id = f.account_id AND d.id = f.id
        AND d.lease_id = f.lease_id
    WHERE d.status = 'pending'
    FOR NO KEY UPDATE OF d SKIP LOCKED)
UPDATE webhook_deliveries AS d SET status = f.status, next_attempt_at = f.next_attempt_at,
    lease_id = NULL, lease_until = NULL, last_attempt_at = f.started_at,
    last_status = f.http_status, last_error = f.error,
    failing_since = CASE WHEN f.error IS NULL THEN d.failing_since
                         ELSE coalesce(d.failing_since, f.started_at) END,
    updated_at = $11
FROM finished AS f, held AS h
WHERE d.account_id = h.account_id AND d.id = h.id AND f.account_id = h.account_id
    AND f.id = h.id AND d.status = 'pending' AND d.lease_id = f.lease_id
RETURNING d.id, f.lease_id
