-- The merchant's answers to a dispute (docs/books.md): text evidence submitted to the provider,
-- or the dispute accepted without contest. Each is a provider operation like a capture or a
-- refund (docs/payments.md): sent with a downstream key, looked up when its outcome was not seen,
-- settled once, its final answer on its row for the key that started it.
CREATE TABLE dispute_responses (
    account_id      uuid        NOT NULL,
    id              uuid        NOT NULL,
    dispute_id      uuid        NOT NULL,
    kind            text        NOT NULL CHECK (kind IN ('evidence', 'accept')),
    status          text        NOT NULL CHECK (status IN ('processing', 'succeeded', 'failed')),
    -- The evidence submitted (an `evidence` response only).
    evidence        text        CHECK (length(evidence) BETWEEN 1 AND 20000),
    failure_code    text,
    failure_message text,
    idempotency_key text,
    attempts        integer     NOT NULL DEFAULT 0,
    next_check_at   timestamptz,
    last_error      text,
    lease_until     timestamptz,
    lease_id        uuid,
    last_send_at    timestamptz,
    answer_status   smallint,
    answer_body     bytea,
    created_at      timestamptz NOT NULL,
    updated_at      timestamptz NOT NULL,
    PRIMARY KEY (account_id, id),
    FOREIGN KEY (account_id, dispute_id) REFERENCES disputes (account_id, id),
    CHECK ((kind = 'evidence') = (evidence IS NOT NULL)),
    CHECK ((status = 'processing') = (next_check_at IS NOT NULL)),
    CHECK ((answer_status IS NULL) = (answer_body IS NULL))
);
-- One answer in flight per dispute: a second waits for the first's outcome.
CREATE UNIQUE INDEX dispute_responses_one_in_flight
    ON dispute_responses (account_id, dispute_id) WHERE status = 'processing';
CREATE INDEX dispute_responses_due ON dispute_responses (next_check_at) WHERE status = 'processing';

ALTER TABLE idempotency_keys DROP CONSTRAINT idempotency_keys_resource_kind_check;
ALTER TABLE idempotency_keys ADD CONSTRAINT idempotency_keys_resource_kind_check
    CHECK (resource_kind IN ('order', 'payment', 'payment_operation', 'refund', 'webhook_endpoint',
        'dispute_response'));
