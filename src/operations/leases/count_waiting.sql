-- In-flight operations that no driver holds: waiting for a retry or the reconciler (the
-- `orderpay_operations_waiting` gauge).
-- Parameters: 1 now.
SELECT count(*) FROM operation_table
WHERE status = 'processing' AND answer_status IS NULL AND (lease_until IS NULL OR lease_until <= $1)
