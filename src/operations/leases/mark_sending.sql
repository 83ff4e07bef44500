-- Notes, under the driver's lease, that an in-flight operation's request is about to be sent
-- again, at the database's clock. No row: it is settled, or its lease was taken over.
-- Parameters: 1 account, 2 operation id, 3 the lease id.
UPDATE operation_table SET last_send_at = clock_timestamp()
WHERE account_id = $1 AND id = $2 AND status = 'processing' AND answer_status IS NULL AND lease_id = $3
