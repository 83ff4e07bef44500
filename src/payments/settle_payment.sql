-- Settles a payment, as one statement: one round trip, one transaction.
-- Moves the payment from `processing` to its terminal state with its final answer (a guarded
-- UPDATE: of two racing settlers one applies), records the transition, and marks the order
-- paid when the payment succeeded. Returns how many payments were settled (0: someone else did
-- first; nothing changed) and how many orders were marked paid.
-- Lock order (docs/architecture.md): the order row first (`locked_order`, which the payment's
-- UPDATE waits on before it touches the payment), then the payment. A phase 1 of the same order
-- holds the order's lock while it inserts its payment, so it either finishes first or sees this
-- payment's outcome; the two never wait on each other in opposite orders.
-- Parameters: 1 account, 2 payment id, 3 order id, 4 new status, 5 provider charge id,
-- 6 failure code, 7 failure message, 8 now, 9 actor, 10 event detail, 11 answer status,
-- 12 answer body.
WITH locked_order AS (
    SELECT id FROM orders WHERE account_id = $1 AND id = $3 FOR UPDATE
), settled AS (
    UPDATE payments
    SET status = $4, provider_charge_id = $5, failure_code = $6, failure_message = $7,
        next_check_at = NULL, lease_until = NULL, lease_id = NULL, updated_at = $8,
        answer_status = $11, answer_body = $12
    WHERE account_id = $1 AND id = $2 AND status = 'processing'
        AND EXISTS (SELECT 1 FROM locked_order)
    RETURNING account_id, id, order_id, status
), logged AS (
    INSERT INTO payment_events (account_id, payment_id, from_status, to_status, actor, detail, at)
    SELECT settled.account_id, settled.id, 'processing', settled.status, $9, $10, $8 FROM settled
), paid AS (
    UPDATE orders
    SET status = 'paid', updated_at = $8
    FROM settled
    WHERE settled.status = 'succeeded' AND orders.account_id = settled.account_id
        AND orders.id = settled.order_id AND orders.status = 'pending_payment'
    RETURNING orders.id
)
SELECT (SELECT count(*) FROM settled) AS settled, (SELECT count(*) FROM paid) AS paid
