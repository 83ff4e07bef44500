-- Phase 1 of a payment, as one statement after the key claim of claim_key.sql (resource kind
-- 'payment', $7 the new payment's id, no answer): one round trip, one transaction.
-- Locks the order, decides, and when the decision is 'started' inserts the payment
-- `processing` for the order's total, leased to this request until $16 and marked as being
-- sent now (the charge request leaves right after the commit). The key row commits with the
-- payment, so a crash after this statement leaves a payment a retry or the reconciler finishes.
-- Returns the decision (each refusal named; see payments::repository::StartOutcome), the order
-- as it was (status, total, currency; NULL if not found) and the order's payment in flight.
-- Lock order (docs/architecture.md): the new key row, then the order row, then the payment.
-- `live` reads with the statement's snapshot, taken before the order's lock was granted: a
-- payment committed in between is missed there, and its unique index entry then refuses the
-- insert (payments_one_active_per_order); the caller runs the statement again.
-- Parameters after the claim's: 13 order id, 14 the amount the client expects (NULL: any),
-- 15 payment method, 16 lease until (also the reconciler's first check), 17 lease id,
-- 18 capture method.
, payable AS (
    SELECT status, total_amount, currency
    FROM orders
    WHERE account_id = $1 AND id = $13 AND EXISTS (SELECT 1 FROM claimed)
    FOR UPDATE
), live AS (
    SELECT id FROM payments
    WHERE account_id = $1 AND order_id = $13 AND status IN ('processing', 'requires_capture')
        AND EXISTS (SELECT 1 FROM payable)
    LIMIT 1
), decided AS (
    SELECT CASE
        WHEN NOT EXISTS (SELECT 1 FROM claimed) THEN 'key_exists'
        WHEN NOT EXISTS (SELECT 1 FROM payable) THEN 'order_not_found'
        WHEN (SELECT status FROM payable) <> 'pending_payment' THEN 'order_not_payable'
        WHEN EXISTS (SELECT 1 FROM live) THEN 'payment_in_progress'
        WHEN $14::numeric IS NOT NULL AND $14 <> (SELECT total_amount FROM payable)
            THEN 'amount_mismatch'
        WHEN (SELECT total_amount FROM payable) = 0 THEN 'nothing_to_pay'
        ELSE 'started'
    END AS outcome
), started AS (
    INSERT INTO payments (account_id, id, order_id, status, amount, currency, payment_method,
        idempotency_key, attempts, next_check_at, lease_until, lease_id, last_send_at,
        capture_method, created_at, updated_at)
    SELECT $1, $7, $13, 'processing', payable.total_amount, payable.currency, $15, $2, 0, $16,
        $16, $17, clock_timestamp(), $18, $11, $11
    FROM payable, decided
    WHERE decided.outcome = 'started'
    RETURNING 1
)
SELECT decided.outcome, payable.status, payable.total_amount, payable.currency,
    (SELECT id FROM live)
FROM decided
LEFT JOIN payable ON true
