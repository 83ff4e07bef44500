-- An authorization that ended at the provider while nothing of ours was in flight: it expired
-- (`canceled`, the order back to `pending_payment`), or a capture we had given up on landed
-- after all (`succeeded`, the order `paid`). One statement, guarded by the payment still being
-- `requires_capture`, so that a capture or void starting meanwhile wins and this changes nothing.
-- Lock order: the order, then the payment.
-- Parameters: 1 account, 2 payment id, 3 order id, 4 new status, 5 amount captured,
-- 6 failure code, 7 failure message, 8 now, 9 actor, 10 the order's new status; 91-93 the
-- payment's event, 94-96 the order's when it is paid (see events::Announce).
WITH locked_order AS (
    SELECT id FROM orders WHERE account_id = $1 AND id = $3 FOR UPDATE
), ended AS (
    UPDATE payments
    SET status = $4, amount_captured = $5, failure_code = $6, failure_message = $7,
        next_check_at = NULL, updated_at = $8
    WHERE account_id = $1 AND id = $2 AND status = 'requires_capture'
        AND EXISTS (SELECT 1 FROM locked_order)
    RETURNING account_id, id, status
), logged AS (
    INSERT INTO payment_events (account_id, payment_id, subject, subject_id, from_status, to_status,
        actor, detail, at)
    SELECT ended.account_id, ended.id, 'payment', ended.id, 'requires_capture', ended.status, $9,
        $7, $8
    FROM ended
), moved AS (
    UPDATE orders
    SET status = $10, updated_at = $8
    FROM ended
    WHERE orders.account_id = $1 AND orders.id = $3 AND orders.status = 'authorized'
    RETURNING orders.id
), announced AS (
    INSERT INTO events (account_id, id, type, data, created_at)
    SELECT $1, $91, $92, $93, $8 FROM ended
    UNION ALL
    SELECT $1, $94, $95, $96, $8 FROM moved WHERE $95::text IS NOT NULL
)
SELECT (SELECT count(*) FROM ended) AS ended, (SELECT count(*) FROM moved) AS moved
