-- Phase 2 of a payment, as one statement: one round trip, one transaction.
-- Moves the payment from `processing` to its terminal state (a guarded UPDATE: of two racing
-- settlers one applies), records the transition, marks the order paid when the payment
-- succeeded, and stores the final answer for the payment's key. Returns how many payments were
-- settled (0: someone else did first; nothing changed) and how many orders were marked paid.
-- Parameters: 1 account, 2 payment id, 3 new status, 4 provider charge id, 5 failure code,
-- 6 failure message, 7 now, 8 actor, 9 event detail, 10 answer status, 11 answer headers,
-- 12 answer body.
WITH settled AS (
    UPDATE payments
    SET status = $3, provider_charge_id = $4, failure_code = $5, failure_message = $6,
        next_check_at = NULL, updated_at = $7
    WHERE account_id = $1 AND id = $2 AND status = 'processing'
    RETURNING account_id, id, order_id, status, idempotency_key
), logged AS (
    INSERT INTO payment_events (account_id, payment_id, from_status, to_status, actor, detail, at)
    SELECT settled.account_id, settled.id, 'processing', settled.status, $8, $9, $7 FROM settled
), paid AS (
    UPDATE orders
    SET status = 'paid', updated_at = $7
    FROM settled
    WHERE settled.status = 'succeeded' AND orders.account_id = settled.account_id
        AND orders.id = settled.order_id AND orders.status = 'pending_payment'
    RETURNING orders.id
), answered AS (
    UPDATE idempotency_keys
    SET state = 'completed', locked_until = NULL, lease_id = NULL, recovery_point = 'finished',
        response_status = $10, response_headers = $11, response_body = $12
    FROM settled
    WHERE idempotency_keys.account_id = settled.account_id
        AND idempotency_keys.key = settled.idempotency_key
        AND idempotency_keys.state = 'in_progress' AND idempotency_keys.resource_id = settled.id
)
SELECT (SELECT count(*) FROM settled) AS settled, (SELECT count(*) FROM paid) AS paid
