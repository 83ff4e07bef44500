-- Leases in-flight operations of one operation table (the template's `operation_table`) whose
-- lease is free (never held, released, or run out), by compare-and-set: of two drivers racing
-- for one operation exactly one gets it. $5 and $6 name one operation (a retry taking it over;
-- $3 = 0: no attempt counted), or, NULL, the statement takes up to $7 due ones, skipping rows
-- other reconcilers are claiming ($3 = 1: each counts an attempt).
-- Parameters: 1 the lease's end (also the next check), 2 the lease id, 3 attempts added, 4 now,
-- 5 account, 6 operation id, 7 how many at most.
-- Returns each leased operation with its attempts and the database's clock once it was leased
-- (the reference of a give-up's guard, operations::SendQuiet).
UPDATE operation_table SET lease_until = $1, lease_id = $2, next_check_at = $1,
    attempts = attempts + $3
WHERE (account_id, id) IN (
    SELECT account_id, id FROM operation_table
    WHERE status = 'processing' AND answer_status IS NULL
        AND (lease_until IS NULL OR lease_until <= $4)
        AND CASE WHEN $5::uuid IS NULL THEN next_check_at <= $4
                 ELSE account_id = $5 AND id = $6 END
    ORDER BY next_check_at LIMIT $7 FOR UPDATE SKIP LOCKED)
RETURNING account_id, id, attempts, clock_timestamp() AS leased_at
