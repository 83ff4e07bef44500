-- The late-refund watch: up to $2 refunds given up on (failed, still watched) due for a look by
-- $1, skipping rows another reconciler is claiming, hidden from the others until $3; each look
-- counts an attempt. Returns the refunds (the columns of RefundRow, in its order) and until when
-- each is watched.
UPDATE refunds SET next_check_at = $3, attempts = attempts + 1
WHERE (account_id, id) IN (
    SELECT account_id, id FROM refunds
    WHERE status = 'failed' AND next_check_at <= $1
    ORDER BY next_check_at LIMIT $2 FOR UPDATE SKIP LOCKED)
RETURNING account_id, id, payment_id, order_id, status, amount, currency, reason,
    provider_refund_id, failure_code, failure_message, idempotency_key, attempts, lease_until,
    lease_id, created_at, updated_at, late_watch_until
