-- Settles a refund, as one statement: one round trip, one transaction.
-- Moves the refund from `processing` to `succeeded` or `failed` with its final answer (a
-- guarded UPDATE: of two racing settlers one applies), moves its amount on the payment from
-- `amount_refunding` to `amount_refunded` (or releases it, when it failed), moves the order
-- (`refunded` once everything captured is refunded, else `partially_refunded`) unless the
-- refund is the system's (of a charge its payment never kept), and records the transition.
-- Returns how many refunds were settled (0: someone else did first) and the order's new status.
-- Lock order (docs/architecture.md): the order, then the payment, then the refund.
-- Parameters: 1 account, 2 refund id, 3 order id, 4 payment id, 5 new status, 6 provider refund
-- id, 7 failure code, 8 failure message, 9 now, 10 actor, 11 event detail, 12 answer status,
-- 13 answer body, 14 whether the order moves, 15 for a give-up, the time its last send must be
-- older than (NULL otherwise: see settle_payment.sql), 16 the order's event id,
-- 17 and 18 the order's JSON after the change as `partially_refunded` and as `refunded` (the
-- statement knows which); 91-93 the refund's event, 94-96 the payment's
-- `payment.late_charge_refunded` when a system refund succeeds (NULL otherwise; see
-- events::Announce); 19 for a give-up, until when the refund is watched for the provider
-- carrying it out late, and 20 its first look (NULL otherwise); 21 when a system refund failed
-- for certain (declined), when its payment's late charge is looked at again (the follow-up that
-- starts another refund; NULL otherwise), 22 for a give-up, the lease it is made under.
WITH locked_order AS (
    SELECT id FROM orders WHERE account_id = $1 AND id = $3 FOR UPDATE
), locked_payment AS (
    SELECT id FROM payments
    WHERE account_id = $1 AND id = $4 AND EXISTS (SELECT 1 FROM locked_order)
    FOR UPDATE
), settled AS (
    UPDATE refunds
    SET status = $5, provider_refund_id = $6, failure_code = $7, failure_message = $8,
        next_check_at = $20, late_watch_until = $19, lease_until = NULL, lease_id = NULL,
        updated_at = $9, answer_status = $12, answer_body = $13
    WHERE account_id = $1 AND id = $2 AND status = 'processing'
        AND ($15::timestamptz IS NULL
            OR ((last_send_at IS NULL OR last_send_at < $15) AND lease_id = $22))
        AND EXISTS (SELECT 1 FROM locked_payment)
    RETURNING account_id, id, payment_id, amount, status
), paid_back AS (
    UPDATE payments
    SET amount_refunding = payments.amount_refunding - settled.amount,
        amount_refunded = payments.amount_refunded
            + CASE WHEN settled.status = 'succeeded' THEN settled.amount ELSE 0 END,
        updated_at = CASE WHEN settled.status = 'succeeded' THEN $9 ELSE payments.updated_at END,
        next_check_at = coalesce($21, payments.next_check_at)
    FROM settled
    WHERE payments.account_id = settled.account_id AND payments.id = settled.payment_id
    RETURNING payments.amount_refunded, payments.amount_captured
), moved AS (
    UPDATE orders
    SET status = CASE WHEN paid_back.amount_refunded >= paid_back.amount_captured
            THEN 'refunded' ELSE 'partially_refunded' END,
        updated_at = $9
    FROM paid_back, settled
    WHERE $14 AND settled.status = 'succeeded' AND orders.account_id = $1 AND orders.id = $3
        AND orders.status IN ('paid', 'partially_refunded')
    RETURNING orders.account_id, orders.status
), announced AS (
    INSERT INTO events (account_id, id, type, data, created_at)
    SELECT $1, $91, $92, $93, $9 FROM settled
    UNION ALL
    SELECT $1, $94, $95, $96, $9 FROM settled WHERE settled.status = 'succeeded' AND $95::text IS NOT NULL
    UNION ALL
    SELECT $1, $16,
        CASE moved.status WHEN 'refunded' THEN 'order.refunded' ELSE 'order.partially_refunded' END,
        CASE moved.status WHEN 'refunded' THEN $18 ELSE $17 END, $9
    FROM moved
), logged AS (
    INSERT INTO payment_events (account_id, payment_id, subject, subject_id, from_status, to_status,
        actor, detail, at)
    SELECT settled.account_id, settled.payment_id, 'refund', settled.id, 'processing',
        settled.status, $10, $11, $9
    FROM settled
)
SELECT (SELECT count(*) FROM settled) AS settled, (SELECT status FROM moved) AS order_status
