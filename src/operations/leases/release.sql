-- Leaves an in-flight operation for a check at $4, noting why ($5), and lets go of the driver's
-- lease if it still holds it. With $4 NULL no check is scheduled: the operation is held for a
-- person (the provider holds its downstream key with other parameters, so no send can help and
-- no check may give it up; the reconciler claims only operations that are due, and a retry of
-- the key may still take it over and look). No row: someone settled it or took it over
-- meanwhile. $7 checks are given back: 1 when the reconciler's claim counted one that the
-- provider refused unacted (our credentials), so a misconfiguration never spends an
-- operation's checks.
-- Parameters: 1 account, 2 operation id, 3 the lease id, 4 the next check, 5 last error, 6 now,
-- 7 checks given back.
UPDATE operation_table SET next_check_at = $4, last_error = $5, lease_until = NULL, lease_id = NULL,
    attempts = greatest(attempts - $7, 0), updated_at = $6
WHERE account_id = $1 AND id = $2 AND status = 'processing' AND answer_status IS NULL AND lease_id = $3
