-- Records a dispute as the provider reports it (a webhook verified by a lookup, the
-- reconciler's listing or look): inserts it when we lack it, else moves it, guarded.
-- Runs after its payment was locked in the same transaction (`payments::lock_of_charge`), so
-- that two recorders of one dispute (a webhook and the reconciler at once) run one after the
-- other and the second sees the first's row: one row, one movement per amount moved.
-- The guard: `won`, `lost` and `warning_closed` never change; `under_review` moves only to
-- `won` or `lost`; `needs_response` only forward (`under_review`, `won`, `lost`); an inquiry
-- (`warning_*`) forward or into a chargeback; the money withdrawn and reinstated only grows.
-- What it breaks is 'refused' and nothing is written. The payment's `amount_disputed` (withdrawn
-- less reinstated, over its disputes) moves in the same statement; when it would not fit what
-- the payment captured beside its refunds ('does_not_fit': a refund reserved the money and is
-- still in flight), nothing is written and the dispute is recorded on a later look.
-- The ledger's movements are the trigger's (migration `disputes`).
-- The dispute is looked up and kept unique within its payment's account (the provider's
-- dispute names one charge, so one payment and one account): the statement reads and writes
-- that account's rows alone.
-- Returns the outcome and the dispute's id (ours).
-- Lock order (docs/architecture.md): the payment (the caller's), then the dispute.
-- Parameters: 1 account, 2 a new id, 3 payment, 4 order, 5 the provider's dispute id,
-- 6 amount, 7 currency, 8 reason, 9 status, 10 closed reason, 11 evidence due by,
-- 12 withdrawn, 13 reinstated, 14 created at the provider, 15 now.
WITH existing AS (
    SELECT id, status, closed_reason, evidence_due_by, amount_withdrawn, amount_reinstated
    FROM disputes
    WHERE provider_dispute_id = $5 AND account_id = $1
    FOR UPDATE
), payment AS (
    SELECT amount_captured - amount_refunded - amount_refunding - amount_disputed AS room
    FROM payments
    WHERE account_id = $1 AND id = $3
), judged AS (
    SELECT e.id,
        e.id IS NOT NULL AND e.status = $9 AND e.closed_reason IS NOT DISTINCT FROM $10
            AND e.evidence_due_by IS NOT DISTINCT FROM $11 AND e.amount_withdrawn = $12
            AND e.amount_reinstated = $13 AS unchanged,
        e.id IS NOT NULL AND e.status NOT IN ('won', 'lost', 'warning_closed')
            AND $12 >= e.amount_withdrawn AND $13 >= e.amount_reinstated
            AND (e.status = $9
                OR (e.status = 'under_review' AND $9 IN ('won', 'lost'))
                OR (e.status = 'needs_response' AND $9 IN ('under_review', 'won', 'lost'))
                OR (e.status = 'warning_under_review' AND $9 <> 'warning_needs_response')
                OR e.status = 'warning_needs_response') AS allowed,
        ($12 - $13) - coalesce(e.amount_withdrawn - e.amount_reinstated, 0) AS delta,
        p.room
    FROM payment AS p
    LEFT JOIN existing AS e ON true
), decided AS (
    SELECT id, delta, CASE
        WHEN id IS NULL AND delta <= room THEN 'created'
        WHEN id IS NULL THEN 'does_not_fit'
        WHEN unchanged THEN 'unchanged'
        WHEN NOT allowed THEN 'refused'
        WHEN delta > room THEN 'does_not_fit'
        ELSE 'updated'
    END AS outcome
    FROM judged
), inserted AS (
    INSERT INTO disputes (account_id, id, payment_id, order_id, provider_dispute_id, amount,
        currency, reason, status, closed_reason, evidence_due_by, amount_withdrawn,
        amount_reinstated, provider_created_at, created_at, updated_at)
    SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $15
    FROM decided
    WHERE decided.outcome = 'created'
    ON CONFLICT (provider_dispute_id, account_id) DO NOTHING
    RETURNING id
), updated AS (
    -- The row by its key (a scalar subquery: a join with `decided` was planned as a walk over
    -- the account's disputes).
    UPDATE disputes
    SET status = $9, closed_reason = $10, evidence_due_by = $11, amount_withdrawn = $12,
        amount_reinstated = $13, updated_at = $15
    WHERE disputes.account_id = $1
        AND disputes.id = (SELECT decided.id FROM decided WHERE decided.outcome = 'updated')
    RETURNING disputes.id
), moved AS (
    UPDATE payments
    SET amount_disputed = payments.amount_disputed + decided.delta
    FROM decided
    WHERE payments.account_id = $1 AND payments.id = $3 AND decided.delta <> 0
        AND (EXISTS (SELECT FROM inserted) OR EXISTS (SELECT FROM updated))
    RETURNING 1
)
SELECT CASE
        WHEN decided.outcome = 'created' AND NOT EXISTS (SELECT FROM inserted) THEN 'changed'
        ELSE decided.outcome END,
    coalesce((SELECT id FROM inserted), decided.id)
FROM decided
