ALTER TABLE dispute_responses
    DROP CONSTRAINT dispute_responses_checked_only_in_flight,
    ADD CONSTRAINT dispute_responses_check1 CHECK ((status = 'processing') = (next_check_at IS NOT NULL));
ALTER TABLE payment_operations
    DROP CONSTRAINT payment_operations_checked_only_in_flight,
    ADD CONSTRAINT payment_operations_check CHECK ((status = 'processing') = (next_check_at IS NOT NULL));
ALTER TABLE refunds
    ADD CONSTRAINT refunds_in_flight_checked CHECK (status <> 'processing' OR next_check_at IS NOT NULL);
