-- Settles a dispute response: moves it from `processing` to its outcome with its final answer, a
-- guarded UPDATE (of two racing settlers one applies). The provider's dispute that came with the
-- outcome is recorded first, in the same transaction (disputes::record), so the answer renders
-- the dispute as it is after.
-- Lock order (docs/architecture.md): the payment, the dispute (recording it), then the response.
-- Parameters: 1 account, 2 response id, 3 status, 4 failure code, 5 failure message, 6 now,
-- 7 answer status, 8 answer body, 9 for a give-up, the time its last send must be older than and
-- 10 the lease it is made under (NULL otherwise: see settle_payment.sql).
-- Returns how many responses were settled (0: someone else did first, or a give-up held back).
WITH settled AS (
    UPDATE dispute_responses
    SET status = $3, failure_code = $4, failure_message = $5, next_check_at = NULL,
        lease_until = NULL, lease_id = NULL, updated_at = $6, answer_status = $7, answer_body = $8
    WHERE account_id = $1 AND id = $2 AND status = 'processing'
        AND ($9::timestamptz IS NULL
            OR ((last_send_at IS NULL OR last_send_at < $9) AND lease_id = $10))
    RETURNING 1
)
SELECT count(*) FROM settled
