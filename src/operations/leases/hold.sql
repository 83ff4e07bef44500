-- Holds an in-flight operation for a person: the provider holds its downstream key with other
-- parameters, so no send can help and no check may give it up. No check is scheduled (the
-- reconciler claims only operations that are due), the driver's lease is let go (a retry of the
-- key may still take it over and look), and why is noted. No row: someone settled it or took it
-- over meanwhile.
-- Parameters: 1 account, 2 operation id, 3 the lease id, 4 last error, 5 now.
UPDATE operation_table SET next_check_at = NULL, last_error = $4, lease_until = NULL, lease_id = NULL,
    updated_at = $5
WHERE account_id = $1 AND id = $2 AND status = 'processing' AND answer_status IS NULL AND lease_id = $3
