-- Starts a refund, as one statement after the key claim of claim_key.sql (resource kind
-- 'refund', $7 the refund's id, no answer; or no key at all, $2 NULL, for a refund the system
-- starts itself).
-- Locks the payment, decides, and when the decision is 'started' reserves the amount on the
-- payment (`amount_refunding`) and inserts the refund `processing`, leased to this request until
-- $16 and marked as being sent now. The reservation is what keeps refunds with different keys
-- from over-refunding: the payment's row is locked and its amounts read as they are now (the
-- lock waits for, and then sees, any refund that reserved before), and a CHECK constraint
-- backs it (refunded + refunding + disputed <= captured). What disputes withdrew and did not
-- reinstate (`amount_disputed`) is not refundable: a refund above what is left is 'disputed'
-- while one of the payment's disputes is open, and 'exceeds_refundable' once they are decided.
-- The decision is read under the payment's lock (`target`: FOR UPDATE waits for a concurrent
-- change, a capture settling or another refund reserving, and reads the row as it committed);
-- the reservation's UPDATE scans the row as the statement's snapshot saw it, so it is guarded by
-- the same bound (succeeded, and refundable covers the amount: the CHECK can never be the one
-- that refuses), and when the two disagree (a change committed while the statement waited) the
-- outcome is 'changed' and nothing of the refund is written: the caller runs it again.
-- A key names at most one refund of a payment, for ever: a key used again past its lifetime
-- (a retry a day later) finds the refund it started, 'existing_refund', and starts nothing.
-- Returns the decision, the payment's status, what was refundable, the refund's amount, and
-- the refund the key started before.
-- Lock order (docs/architecture.md): the new key row, then the payment, then the refund.
-- Parameters after the claim's: 13 payment id, 14 amount (NULL: all that is refundable),
-- 15 reason, 16 lease until (also the reconciler's first check), 17 lease id, 18 whether the
-- payment must have succeeded (a client's refund) or failed (the system's refund of a charge
-- that landed after its payment was given up on).
, target AS (
    SELECT status, order_id, currency,
        amount_captured - amount_refunded - amount_refunding - amount_disputed AS refundable,
        EXISTS (SELECT FROM disputes AS d
            WHERE d.account_id = payments.account_id AND d.payment_id = payments.id
                AND d.status IN ('warning_needs_response', 'warning_under_review', 'needs_response',
                    'under_review')) AS disputed
    FROM payments
    WHERE account_id = $1 AND id = $13 AND ($2::text IS NULL OR EXISTS (SELECT 1 FROM claimed))
    FOR UPDATE
), earlier AS (
    SELECT id FROM refunds
    WHERE $2::text IS NOT NULL AND account_id = $1 AND payment_id = $13 AND idempotency_key = $2
    LIMIT 1
), decided AS (
    SELECT CASE
        WHEN $2::text IS NOT NULL AND NOT EXISTS (SELECT 1 FROM claimed) THEN 'key_exists'
        WHEN NOT EXISTS (SELECT 1 FROM target) THEN 'payment_not_found'
        WHEN (SELECT id FROM earlier) IS NOT NULL THEN 'existing_refund'
        WHEN (SELECT status FROM target) <> $18 THEN 'invalid_state'
        WHEN (coalesce($14, (SELECT refundable FROM target)) <= 0
            OR coalesce($14, 0) > (SELECT refundable FROM target))
            AND (SELECT disputed FROM target) THEN 'disputed'
        WHEN coalesce($14, (SELECT refundable FROM target)) <= 0
            OR coalesce($14, 0) > (SELECT refundable FROM target) THEN 'exceeds_refundable'
        ELSE 'started'
    END AS outcome,
    coalesce($14, (SELECT refundable FROM target)) AS amount
), reserved AS (
    UPDATE payments
    SET amount_refunding = amount_refunding + decided.amount
    FROM decided
    WHERE payments.account_id = $1 AND payments.id = $13 AND decided.outcome = 'started'
        AND payments.status = $18
        AND payments.amount_captured - payments.amount_refunded - payments.amount_refunding
            - payments.amount_disputed >= decided.amount
    RETURNING payments.id
), started AS (
    INSERT INTO refunds (account_id, id, payment_id, order_id, status, amount, currency, reason,
        idempotency_key, attempts, next_check_at, lease_until, lease_id, last_send_at,
        created_at, updated_at)
    SELECT $1, $7, $13, target.order_id, 'processing', decided.amount, target.currency, $15, $2,
        0, $16, $16, $17, clock_timestamp(), $11, $11
    FROM target, decided, reserved
    RETURNING 1
)
SELECT CASE WHEN decided.outcome = 'started' AND NOT EXISTS (SELECT 1 FROM reserved) THEN 'changed'
        ELSE decided.outcome END,
    target.status, target.refundable, decided.amount, target.currency, target.order_id,
    (SELECT id FROM earlier)
FROM decided
LEFT JOIN target ON true
