-- Deletes account $1's live endpoint $2 at $3 (its secrets dropped) and cancels its pending
-- deliveries in the same statement. Returns how many endpoints were deleted (0 or 1) and how
-- many deliveries were canceled.
WITH gone AS (
    UPDATE webhook_endpoints SET deleted_at = $3, updated_at = $3, secret = NULL,
        previous_secret = NULL, previous_secret_expires_at = NULL
    WHERE account_id = $1 AND id = $2 AND deleted_at IS NULL
    RETURNING account_id, id),
canceled AS (
    UPDATE webhook_deliveries AS d SET status = 'canceled', next_attempt_at = NULL,
        lease_id = NULL, lease_until = NULL, updated_at = $3
    FROM gone WHERE d.account_id = gone.account_id AND d.endpoint_id = gone.id
        AND d.status = 'pending'
    RETURNING d.id)
SELECT (SELECT count(*) FROM gone) AS deleted, (SELECT count(*) FROM canceled) AS canceled
