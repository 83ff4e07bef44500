-- Settles a payment's charge or authorization, as one statement: one round trip, one
-- transaction. Moves the payment from `processing` (its charge in flight: no answer yet) to
-- its outcome with its final answer (a guarded UPDATE: of two racing settlers one applies),
-- records the transition, and moves the order: `paid` for a captured charge, `authorized` for
-- an authorization. Returns how many payments were settled (0: someone else did first; nothing
-- changed) and how many orders were moved.
-- Lock order (docs/architecture.md): the order row first (`locked_order`, which the payment's
-- UPDATE waits on before it touches the payment), then the payment. A phase 1 of the same order
-- holds the order's lock while it inserts its payment, so it either finishes first or sees this
-- payment's outcome; the two never wait on each other in opposite orders.
-- Parameters: 1 account, 2 payment id, 3 order id, 4 new status, 5 provider charge id,
-- 6 failure code, 7 failure message, 8 now, 9 actor, 10 event detail, 11 answer status,
-- 12 answer body, 13 amount captured, 14 authorization expires at, 15 next check (the
-- authorization's watch, or the late-charge watch of a payment given up on), 16 the order's new
-- status (NULL: unchanged), 17 for a give-up (or an operator's failure without --force), the
-- time its last send must be older than (NULL otherwise), 18 until when a payment given up on
-- is watched for a charge that lands late (NULL otherwise), 19 the lease the give-up is made
-- under; 91-93 the payment's event (id, type, the payment's JSON after the change), 94-96 the
-- order's event when the order moves to a state that has one (NULL otherwise): see
-- events::Announce.
-- The events go in with the change (the transactional outbox): none when nothing changed.
-- The give-up guard orders a give-up against every send (operations::SendQuiet): a send marks
-- `last_send_at` under its lease before it leaves, so a send that could still land when the
-- give-up's lookup asked (the database's clock when its lease was taken, less the provider
-- timeout and a margin: $17) holds the give-up back, and a send that would start after the
-- give-up finds the payment settled and does not leave. The give-up applies only while its
-- lease holds the payment: nobody sent under it.
WITH locked_order AS (
    SELECT id FROM orders WHERE account_id = $1 AND id = $3 FOR UPDATE
), settled AS (
    UPDATE payments
    SET status = $4, provider_charge_id = $5, failure_code = $6, failure_message = $7,
        amount_captured = $13, authorization_expires_at = $14, next_check_at = $15,
        late_watch_until = $18, lease_until = NULL, lease_id = NULL, updated_at = $8,
        answer_status = $11,
        -- The answer by its event when they are the same bytes (operation_answer_by_its_event).
        answer_body = CASE WHEN $12 = $93 THEN NULL ELSE $12 END,
        answer_event_id = CASE WHEN $12 = $93 THEN $91 END
    WHERE account_id = $1 AND id = $2 AND status = 'processing' AND answer_status IS NULL
        AND ($17::timestamptz IS NULL
            OR ((last_send_at IS NULL OR last_send_at < $17) AND lease_id = $19))
        AND EXISTS (SELECT 1 FROM locked_order)
    RETURNING account_id, id, order_id, status
), logged AS (
    INSERT INTO payment_events (account_id, payment_id, subject, subject_id, from_status, to_status,
        actor, detail, at)
    SELECT settled.account_id, settled.id, 'payment', settled.id, 'processing', settled.status, $9,
        $10, $8
    FROM settled
), moved AS (
    UPDATE orders
    SET status = $16, updated_at = $8
    FROM settled
    WHERE $16::text IS NOT NULL AND orders.account_id = settled.account_id
        AND orders.id = settled.order_id AND orders.status = 'pending_payment'
    RETURNING orders.id
), announced AS (
    INSERT INTO events (account_id, id, type, data, created_at)
    SELECT $1, $91, $92, $93, $8 FROM settled
    UNION ALL
    SELECT $1, $94, $95, $96, $8 FROM moved WHERE $95::text IS NOT NULL
)
SELECT (SELECT count(*) FROM settled) AS settled, (SELECT count(*) FROM moved) AS moved
