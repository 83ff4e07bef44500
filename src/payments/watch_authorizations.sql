-- The reconciler's watch on authorizations: up to $2 `requires_capture` payments due for a look
-- by $1, skipping rows another reconciler is claiming, hidden from the others until $3.
-- Returns the payments (the columns of PaymentRow, in its order).
UPDATE payments SET next_check_at = $3
WHERE (account_id, id) IN (
    SELECT account_id, id FROM payments
    WHERE status = 'requires_capture' AND next_check_at <= $1
    ORDER BY next_check_at LIMIT $2 FOR UPDATE SKIP LOCKED)
RETURNING account_id, id, order_id, status, amount, currency, capture_method, amount_captured,
    amount_refunded, amount_disputed, authorization_expires_at, payment_method, provider_charge_id, failure_code,
    failure_message, idempotency_key, attempts, next_check_at, last_error, lease_until, lease_id, last_send_at,
    created_at, updated_at
