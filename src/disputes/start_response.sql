-- Starts the merchant's answer to a dispute (evidence or accept), as one statement after the key
-- claim of claim_key.sql (resource kind 'dispute_response', $7 the response's id, no answer).
-- Locks the dispute, decides, and when the decision is 'started' inserts the response
-- `processing`, leased to this request until $16 and marked as being sent now. Only a dispute
-- that needs a response (`needs_response`, `warning_needs_response`) takes one, evidence only
-- before it is due; one response is in flight per dispute (a unique index).
-- The decision is read under the dispute's lock, but `in_flight` reads the statement's snapshot,
-- which may predate a response committed while the statement waited for the lock: the insert
-- then meets the unique index and writes nothing, the outcome is 'changed', and the caller runs
-- the statement again (it sees the response in flight then).
-- Returns the decision, the dispute's status and evidence due date, and the response in flight.
-- Lock order (docs/architecture.md): the new key row, then the dispute, then the response.
-- Parameters after the claim's: 13 dispute id, 14 kind ('evidence' or 'accept'), 15 the
-- evidence (NULL for accept), 16 lease until (also the reconciler's first check), 17 lease id.
, target AS (
    SELECT status, evidence_due_by
    FROM disputes
    WHERE account_id = $1 AND id = $13 AND EXISTS (SELECT 1 FROM claimed)
    FOR UPDATE
), in_flight AS (
    SELECT id FROM dispute_responses
    WHERE account_id = $1 AND dispute_id = $13 AND status = 'processing'
), decided AS (
    SELECT CASE
        WHEN NOT EXISTS (SELECT 1 FROM claimed) THEN 'key_exists'
        WHEN NOT EXISTS (SELECT 1 FROM target) THEN 'dispute_not_found'
        WHEN (SELECT status FROM target) NOT IN ('needs_response', 'warning_needs_response')
            THEN 'invalid_state'
        WHEN $14 = 'evidence' AND (SELECT evidence_due_by FROM target) <= $11 THEN 'past_due'
        WHEN EXISTS (SELECT 1 FROM in_flight) THEN 'in_flight'
        ELSE 'started'
    END AS outcome
), started AS (
    INSERT INTO dispute_responses (account_id, id, dispute_id, kind, status, evidence,
        idempotency_key, attempts, next_check_at, lease_until, lease_id, last_send_at,
        created_at, updated_at)
    SELECT $1, $7, $13, $14, 'processing', $15, $2, 0, $16, $16, $17, clock_timestamp(), $11, $11
    FROM decided
    WHERE decided.outcome = 'started'
    ON CONFLICT DO NOTHING
    RETURNING 1
)
SELECT CASE WHEN decided.outcome = 'started' AND NOT EXISTS (SELECT 1 FROM started) THEN 'changed'
        ELSE decided.outcome END,
    target.status, target.evidence_due_by, (SELECT id FROM in_flight LIMIT 1)
FROM decided
LEFT JOIN target ON true
