UPDATE payments AS o SET answer_body = e.data, answer_event_id = NULL
FROM events AS e WHERE e.account_id = o.account_id AND e.id = o.answer_event_id;
UPDATE payment_operations AS o SET answer_body = e.data, answer_event_id = NULL
FROM events AS e WHERE e.account_id = o.account_id AND e.id = o.answer_event_id;
ALTER TABLE payments DROP CONSTRAINT payments_answered_once, DROP COLUMN answer_event_id,
    ADD CONSTRAINT payments_check1 CHECK ((answer_status IS NULL) = (answer_body IS NULL));
ALTER TABLE payment_operations DROP CONSTRAINT payment_operations_answered_once,
    DROP COLUMN answer_event_id,
    ADD CONSTRAINT payment_operations_check1 CHECK ((answer_status IS NULL) = (answer_body IS NULL));
ALTER TABLE refunds DROP CONSTRAINT refunds_answered_once, DROP COLUMN answer_event_id,
    ADD CONSTRAINT refunds_check1 CHECK ((answer_status IS NULL) = (answer_body IS NULL));
ALTER TABLE dispute_responses DROP CONSTRAINT dispute_responses_answered_once,
    DROP COLUMN answer_event_id,
    ADD CONSTRAINT dispute_responses_check2 CHECK ((answer_status IS NULL) = (answer_body IS NULL));
