-- An operation in flight may be held for a person with no check scheduled: the provider holds
-- its downstream key with other parameters (`idempotency_error`), so no send can help and no
-- check may give it up (operations/leases/release.sql with no next check). Payments allowed
-- that already; the other operation tables required a check while in flight, so holding a
-- refund, a capture or void, or a dispute response failed on that CHECK. What stays: no check
-- is scheduled on an operation that is not in flight (for a refund, unless its late watch runs:
-- refunds_checked_only_when_watched).
ALTER TABLE refunds DROP CONSTRAINT refunds_in_flight_checked;
ALTER TABLE payment_operations
    DROP CONSTRAINT payment_operations_check,
    ADD CONSTRAINT payment_operations_checked_only_in_flight
        CHECK (next_check_at IS NULL OR status = 'processing');
ALTER TABLE dispute_responses
    DROP CONSTRAINT dispute_responses_check1,
    ADD CONSTRAINT dispute_responses_checked_only_in_flight
        CHECK (next_check_at IS NULL OR status = 'processing');
