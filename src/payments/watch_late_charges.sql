-- The late-charge watch: up to $2 failed payments under watch due for a look by $1 (for a
-- charge that landed late, or once one is recorded, for its refund's follow-up), skipping rows
-- another reconciler is claiming, hidden from the others until $3; each look counts an attempt.
-- Returns the payments (the columns of PaymentRow, in its order), until when each is watched,
-- and the late charge recorded on it.
UPDATE payments SET next_check_at = $3, attempts = attempts + 1
WHERE (account_id, id) IN (
    SELECT account_id, id FROM payments
    WHERE status = 'failed' AND late_watch_until IS NOT NULL AND next_check_at <= $1
    ORDER BY next_check_at LIMIT $2 FOR UPDATE SKIP LOCKED)
RETURNING account_id, id, order_id, status, amount, currency, capture_method, amount_captured,
    amount_refunded, amount_disputed, authorization_expires_at, payment_method, provider_charge_id, failure_code,
    failure_message, idempotency_key, attempts, next_check_at, last_error, lease_until, lease_id, last_send_at,
    created_at, updated_at, late_watch_until, late_charge_amount
