-- Starts a capture or a void of an authorized payment, as one statement after the key claim of
-- claim_key.sql (resource kind 'payment_operation', $7 the operation's id, no answer).
-- Locks the payment, decides, and when the decision is 'started' moves the payment to
-- `processing` (its outcome now depends on this operation) and inserts the operation
-- `processing`, leased to this request until $16 and marked as being sent now. Only an
-- authorized payment (`requires_capture`) can be captured or voided, and a capture takes at most
-- the authorized amount; one such operation is in flight per payment (a unique index).
-- The decision is read under the payment's lock (`target`: FOR UPDATE waits for a concurrent
-- change and reads the row as it committed), but the UPDATE that holds the payment scans it as
-- the statement's snapshot saw it; so it is guarded by the same state, and when the two disagree
-- (a change committed while the statement waited) the outcome is 'changed' and nothing of the
-- operation is written: the caller runs the statement again.
-- Returns the decision, and the payment's status, capturable amount and failure code as they
-- were (a payment canceled because its authorization expired answers 402, whoever noticed).
-- Lock order (docs/architecture.md): the new key row, then the payment, then the operation.
-- Parameters after the claim's: 13 payment id, 14 kind ('capture' or 'void'), 15 the capture's
-- amount (NULL: all that is capturable; always NULL for a void), 16 lease until (also the
-- reconciler's first check), 17 lease id.
, target AS (
    SELECT status, amount, failure_code
    FROM payments
    WHERE account_id = $1 AND id = $13 AND EXISTS (SELECT 1 FROM claimed)
    FOR UPDATE
), decided AS (
    SELECT CASE
        WHEN NOT EXISTS (SELECT 1 FROM claimed) THEN 'key_exists'
        WHEN NOT EXISTS (SELECT 1 FROM target) THEN 'payment_not_found'
        WHEN (SELECT status FROM target) <> 'requires_capture' THEN 'invalid_state'
        WHEN $15::numeric IS NOT NULL AND $15 > (SELECT amount FROM target) THEN 'exceeds_capturable'
        ELSE 'started'
    END AS outcome
), held AS (
    UPDATE payments
    SET status = 'processing', next_check_at = NULL, updated_at = $11
    FROM decided
    WHERE payments.account_id = $1 AND payments.id = $13 AND decided.outcome = 'started'
        AND payments.status = 'requires_capture'
    RETURNING payments.amount
), started AS (
    INSERT INTO payment_operations (account_id, id, payment_id, kind, status, amount,
        idempotency_key, attempts, next_check_at, lease_until, lease_id, last_send_at,
        created_at, updated_at)
    SELECT $1, $7, $13, $14, 'processing',
        CASE WHEN $14 = 'capture' THEN coalesce($15, held.amount) END, $2, 0, $16, $16, $17,
        clock_timestamp(), $11, $11
    FROM held
    RETURNING 1
)
SELECT CASE WHEN decided.outcome = 'started' AND NOT EXISTS (SELECT 1 FROM held) THEN 'changed'
        ELSE decided.outcome END,
    target.status, target.amount, target.failure_code
FROM decided
LEFT JOIN target ON true
