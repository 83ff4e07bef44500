-- Settles a capture or a void, as one statement: one round trip, one transaction.
-- Moves the operation from `processing` to its outcome with its final answer (a guarded UPDATE:
-- of two racing settlers one applies), moves the payment out of `processing` (captured:
-- `succeeded`; voided or expired: `canceled`; a capture declined or given up: back to
-- `requires_capture`), moves the order (`paid`, or back to `pending_payment`), and records both
-- transitions. Returns how many operations were settled (0: someone else did first) and how
-- many orders were moved.
-- Lock order (docs/architecture.md): the order, then the payment, then the operation.
-- Parameters: 1 account, 2 operation id, 3 order id, 4 payment id, 5 the operation's status,
-- 6 its failure code, 7 its failure message, 8 now, 9 actor, 10 event detail, 11 answer status,
-- 12 answer body, 13 the payment's new status, 14 the amount captured (NULL: unchanged),
-- 15 the payment's failure code, 16 its failure message, 17 its next check (the authorization's
-- watch, when it is authorized again), 18 the order's new status (NULL: unchanged), 19 for a
-- give-up, the time its last send must be older than and 20 the lease it is made under (NULL
-- otherwise: see settle_payment.sql); 91-93 the payment's event when it moves to `succeeded` or `canceled`,
-- 94-96 the order's when it is paid (NULL otherwise; see events::Announce).
WITH locked_order AS (
    SELECT id FROM orders WHERE account_id = $1 AND id = $3 FOR UPDATE
), locked_payment AS (
    SELECT id, status FROM payments
    WHERE account_id = $1 AND id = $4 AND EXISTS (SELECT 1 FROM locked_order)
    FOR UPDATE
), settled AS (
    UPDATE payment_operations
    SET status = $5, failure_code = $6, failure_message = $7, next_check_at = NULL,
        lease_until = NULL, lease_id = NULL, updated_at = $8, answer_status = $11,
        -- The answer by its event when they are the same bytes (see settle_payment.sql) and
        -- the event is written: only when the payment moves (`moved_payment`, which finds the
        -- row `locked_payment` holds, in the status read under that lock). A capture declined
        -- or given up has no event.
        answer_body = CASE WHEN $12 = $93 AND (SELECT status FROM locked_payment) = 'processing'
            THEN NULL ELSE $12 END,
        answer_event_id = CASE WHEN $12 = $93 AND (SELECT status FROM locked_payment) = 'processing'
            THEN $91 END
    WHERE account_id = $1 AND id = $2 AND status = 'processing'
        AND ($19::timestamptz IS NULL
            OR ((last_send_at IS NULL OR last_send_at < $19) AND lease_id = $20))
        AND EXISTS (SELECT 1 FROM locked_payment)
    RETURNING account_id, id, payment_id, kind, status
), moved_payment AS (
    UPDATE payments
    SET status = $13, amount_captured = coalesce($14, payments.amount_captured),
        failure_code = $15, failure_message = $16, next_check_at = $17, updated_at = $8
    FROM settled
    WHERE payments.account_id = settled.account_id AND payments.id = settled.payment_id
        AND payments.status = 'processing'
    RETURNING payments.account_id, payments.id, payments.status
), moved_order AS (
    UPDATE orders
    SET status = $18, updated_at = $8
    FROM moved_payment
    WHERE $18::text IS NOT NULL AND orders.account_id = $1 AND orders.id = $3
        AND orders.status = 'authorized'
    RETURNING orders.id
), logged AS (
    INSERT INTO payment_events (account_id, payment_id, subject, subject_id, from_status, to_status,
        actor, detail, at)
    SELECT settled.account_id, settled.payment_id, settled.kind, settled.id, 'processing',
        settled.status, $9, $10, $8
    FROM settled
    UNION ALL
    SELECT moved_payment.account_id, moved_payment.id, 'payment', moved_payment.id, 'processing',
        moved_payment.status, $9, $10, $8
    FROM moved_payment
), announced AS (
    INSERT INTO events (account_id, id, type, data, created_at)
    SELECT $1, $91, $92, $93, $8 FROM moved_payment WHERE $92::text IS NOT NULL
    UNION ALL
    SELECT $1, $94, $95, $96, $8 FROM moved_order WHERE $95::text IS NOT NULL
)
SELECT (SELECT count(*) FROM settled) AS settled, (SELECT count(*) FROM moved_order) AS moved
