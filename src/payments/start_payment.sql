-- Phase 1 of a payment, as one statement: one round trip, one transaction.
-- Claims the key in progress with a lease, locks the order, and inserts the payment
-- `processing` for the order's total if the order is payable (and, when the client gave an
-- amount, it matches). The key row commits with the payment, so a crash after this statement
-- leaves a payment a retry or the reconciler can finish.
-- Returns whether the key was claimed, the order as it was (status, total, currency; NULL if it
-- does not exist), whether the payment was inserted, and, when the key existed, its row.
-- A second payment in flight for the order violates payments_one_active_per_order: the
-- statement fails and nothing is written.
-- Parameters: 1 account, 2 key, 3 method, 4 route, 5 fingerprint, 6 now, 7 key expires at,
-- 8 lease until, 9 lease id, 10 payment id, 11 order id, 12 payment method, 13 first check at,
-- 14 the amount the client expects (NULL: any).
WITH claimed AS (
    INSERT INTO idempotency_keys (account_id, key, method, route, fingerprint, state, locked_until,
        lease_id, recovery_point, resource_id, created_at, expires_at)
    VALUES ($1, $2, $3, $4, $5, 'in_progress', $8, $9, 'payment_created', $10, $6, $7)
    ON CONFLICT DO NOTHING
    RETURNING 1
), payable AS (
    SELECT orders.status, orders.total_amount, orders.currency
    FROM orders
    WHERE orders.account_id = $1 AND orders.id = $11 AND EXISTS (SELECT 1 FROM claimed)
    FOR UPDATE
), started AS (
    INSERT INTO payments (account_id, id, order_id, status, amount, currency, payment_method,
        idempotency_key, attempts, next_check_at, created_at, updated_at)
    SELECT $1, $10, $11, 'processing', payable.total_amount, payable.currency, $12, $2, 0, $13,
        $6, $6
    FROM payable
    WHERE payable.status = 'pending_payment' AND ($14 IS NULL OR $14 = payable.total_amount)
    RETURNING 1
)
SELECT outcome.claimed, payable.status, payable.total_amount, payable.currency,
    (SELECT count(*) FROM started) AS started,
    existing.account_id, existing.key, existing.method, existing.route, existing.fingerprint,
    existing.state, existing.locked_until, existing.recovery_point, existing.resource_id,
    existing.response_status, existing.response_headers, existing.response_body,
    existing.created_at, existing.expires_at, existing.lease_id
FROM (SELECT count(*) AS claimed FROM claimed) AS outcome
LEFT JOIN payable ON true
LEFT JOIN idempotency_keys AS existing
    ON outcome.claimed = 0 AND existing.account_id = $1 AND existing.key = $2
