-- Corrects a settled refund to what the provider confirmed by a lookup (never by a webhook's
-- word alone): `failed` -> `succeeded` (the provider carried out a refund we had given up on) or
-- `succeeded` -> `failed` (a reversal: the provider could not return the money after all). These
-- are the only transitions out of a final state (docs/payments.md). The refund's stored answer
-- is never touched: it is what the client was told at the time.
-- Runs in a transaction that has locked the order and then the payment (lock order,
-- docs/architecture.md), and decided from what it read under those locks: the amounts move by
-- the refund's amount, the order to what they now say (unless the refund is the system's), the
-- watch of a refund given up on ends. Returns how many refunds were corrected (0: it had moved
-- on meanwhile; nothing changed).
-- Parameters: 1 account, 2 refund id, 3 payment id, 4 order id, 5 from status, 6 to status,
-- 7 provider refund id (NULL: unchanged), 8 failure code, 9 failure message, 10 now, 11 actor,
-- 12 the audit row's detail, 13 what amount_refunded moves by (signed), 14 the order's new
-- status (NULL: unchanged), 15 when a system refund's payment is looked at again (a late charge
-- no longer refunded: the follow-up starts another refund; NULL: unchanged), 16 for the
-- late-refund watch's correction, the next look its claim set (NULL otherwise): a provider
-- webhook reporting the refund failed while the watch's lookup was on its way moved the look
-- forward, so the lookup may be stale: it is not applied, and the refund is looked at again;
-- 91-93 the refund's
-- event (`"correction": true`), 94-96 the order's event for its new status, or the payment's
-- `payment.late_charge_refunded` (NULL otherwise; see events::Announce).
WITH corrected AS (
    UPDATE refunds
    SET status = $6, provider_refund_id = coalesce($7, provider_refund_id), failure_code = $8,
        failure_message = $9, next_check_at = NULL, updated_at = $10
    WHERE account_id = $1 AND id = $2 AND status = $5
        AND ($16::timestamptz IS NULL OR next_check_at = $16)
    RETURNING account_id, id, payment_id
), moved_payment AS (
    UPDATE payments
    SET amount_refunded = payments.amount_refunded + $13,
        next_check_at = coalesce($15, payments.next_check_at), updated_at = $10
    FROM corrected
    WHERE payments.account_id = $1 AND payments.id = $3
    RETURNING payments.id
), moved_order AS (
    UPDATE orders
    SET status = $14, updated_at = $10
    FROM moved_payment
    WHERE $14::text IS NOT NULL AND orders.account_id = $1 AND orders.id = $4
    RETURNING orders.id
), announced AS (
    INSERT INTO events (account_id, id, type, data, created_at)
    SELECT $1, $91, $92, $93, $10 FROM corrected
    UNION ALL
    SELECT $1, $94, $95, $96, $10 FROM moved_payment WHERE $95::text IS NOT NULL
), logged AS (
    INSERT INTO payment_events (account_id, payment_id, subject, subject_id, from_status, to_status,
        actor, detail, at)
    SELECT corrected.account_id, corrected.payment_id, 'refund', corrected.id, $5, $6, $11, $12, $10
    FROM corrected
)
SELECT count(*) FROM corrected
