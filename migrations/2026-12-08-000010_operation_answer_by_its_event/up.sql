-- A payment's or a capture's (or void's) stored answer is, when it succeeded, the data of the
-- event written by the same settle, byte for byte: both are the payment as settled, and
-- neither ever changes. The row names that event instead of holding a second copy (about 600
-- bytes). On a payment it pays more than once: every later update of the payment (a refund's
-- reservation and settle, a capture's start and settle, a dispute) wrote a new version of the
-- row, the answer included. A retry of the key reads the body from the event; the service
-- refuses to start with events kept for less time than keys (src/config/mod.rs), and the event
-- is written after the key that started the operation, so it outlives that key. Past the key,
-- only whether the operation has an answer is read (`answer_status`), never its body.
-- A refusal (a decline, a problem) has no event with its bytes and stays on the row. So does a
-- refund's answer: a refund is found again by its client key long after its request's key
-- (`start_refund.sql`), and is answered with its first answer then too.
-- refunds and dispute_responses have the column so that every operation table answers the
-- same way (src/operations/leases/standing.sql); their settles never set it.
-- The checks are NOT VALID: every existing row meets them (the new column is NULL, and the
-- check they replace held), so the tables are not scanned under their lock.
ALTER TABLE payments ADD COLUMN answer_event_id uuid,
    DROP CONSTRAINT payments_check1,
    ADD CONSTRAINT payments_answered_once
        CHECK ((answer_status IS NULL) = (answer_body IS NULL AND answer_event_id IS NULL)
            AND (answer_body IS NULL OR answer_event_id IS NULL)) NOT VALID;
ALTER TABLE payment_operations ADD COLUMN answer_event_id uuid,
    DROP CONSTRAINT payment_operations_check1,
    ADD CONSTRAINT payment_operations_answered_once
        CHECK ((answer_status IS NULL) = (answer_body IS NULL AND answer_event_id IS NULL)
            AND (answer_body IS NULL OR answer_event_id IS NULL)) NOT VALID;
ALTER TABLE refunds ADD COLUMN answer_event_id uuid,
    DROP CONSTRAINT refunds_check1,
    ADD CONSTRAINT refunds_answered_once
        CHECK ((answer_status IS NULL) = (answer_body IS NULL) AND answer_event_id IS NULL) NOT VALID;
ALTER TABLE dispute_responses ADD COLUMN answer_event_id uuid,
    DROP CONSTRAINT dispute_responses_check2,
    ADD CONSTRAINT dispute_responses_answered_once
        CHECK ((answer_status IS NULL) = (answer_body IS NULL) AND answer_event_id IS NULL) NOT VALID;
