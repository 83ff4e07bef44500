-- Payments: one attempt to charge an order through the payment provider. See PAYMENTS.md.
-- Every provider call for a payment carries the downstream key `orderpay_pay_<id>`, derived from
-- the id (so not stored): every re-drive of one payment is the same charge at the provider.
CREATE TABLE payments (
    account_id         uuid          NOT NULL,
    id                 uuid          NOT NULL,
    order_id           uuid          NOT NULL,
    status             text          NOT NULL CHECK (status IN ('processing', 'succeeded', 'failed')),
    amount             numeric(19,4) NOT NULL CHECK (amount >= 0),
    currency           text          NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    payment_method     text          NOT NULL,
    provider_charge_id text,
    failure_code       text,
    failure_message    text,
    -- The client's Idempotency-Key that created the payment, so that whoever settles the payment
    -- (the request, a retry, the reconciler) stores the final answer for that key.
    idempotency_key    text,
    -- Reconciliation: provider checks made, when the next one is due, and what the last one saw.
    attempts           integer       NOT NULL DEFAULT 0,
    next_check_at      timestamptz,
    last_error         text,
    created_at         timestamptz   NOT NULL,
    updated_at         timestamptz   NOT NULL,
    PRIMARY KEY (account_id, id),
    FOREIGN KEY (account_id, order_id) REFERENCES orders (account_id, id),
    CHECK ((status = 'processing') = (next_check_at IS NOT NULL))
);

-- An order has at most one payment in flight or succeeded: it is paid at most once, and a second
-- attempt cannot start while the outcome of the first is unknown. Enforced here, not only in code.
CREATE UNIQUE INDEX payments_one_active_per_order
    ON payments (account_id, order_id) WHERE status IN ('processing', 'succeeded');

-- The reconciler's work queue: processing payments by when they are due.
CREATE INDEX payments_due ON payments (next_check_at) WHERE status = 'processing';

-- Every status transition of a payment, written in the transaction that applied it: an audit
-- trail for operators, and the proof that racing workers applied a transition once.
CREATE TABLE payment_events (
    account_id  uuid        NOT NULL,
    payment_id  uuid        NOT NULL,
    id          bigint      GENERATED ALWAYS AS IDENTITY,
    from_status text        NOT NULL,
    to_status   text        NOT NULL,
    actor       text        NOT NULL CHECK (actor IN ('request', 'reconciler')),
    detail      text,
    at          timestamptz NOT NULL,
    PRIMARY KEY (account_id, payment_id, id),
    FOREIGN KEY (account_id, payment_id) REFERENCES payments (account_id, id)
);
