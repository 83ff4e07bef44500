-- Money back and two-step charges: refunds, manual capture and void. Each is a provider
-- operation of its own, with its own row holding its status, lease, last send and final answer,
-- driven by the same engine as a payment's charge.

-- Orders gain the states of an authorized payment and of refunds.
ALTER TABLE orders DROP CONSTRAINT orders_status_check;
ALTER TABLE orders ADD CONSTRAINT orders_status_check CHECK (status IN
    ('pending_payment', 'authorized', 'paid', 'partially_refunded', 'refunded', 'cancelled'));

-- Payments: a capture method, what was captured and refunded, and the authorization's end.
-- Statuses are spelled as Stripe spells them (`canceled`); orders keep `cancelled`.
ALTER TABLE payments DROP CONSTRAINT payments_status_check;
ALTER TABLE payments DROP CONSTRAINT payments_check;
ALTER TABLE payments
    ADD CONSTRAINT payments_status_check CHECK (status IN
        ('processing', 'requires_capture', 'succeeded', 'failed', 'canceled')),
    ADD COLUMN capture_method text NOT NULL DEFAULT 'automatic'
        CHECK (capture_method IN ('automatic', 'manual')),
    -- Captured by the provider: the amount on success (automatic) or of the capture (manual).
    ADD COLUMN amount_captured numeric(19,4) NOT NULL DEFAULT 0 CHECK (amount_captured >= 0),
    -- Refunds that succeeded, and refunds in flight (their outcome unknown). A new refund is
    -- allowed only while captured - refunded - refunding covers it: a guarded UPDATE of these
    -- columns is what keeps concurrent refunds from over-refunding.
    ADD COLUMN amount_refunded numeric(19,4) NOT NULL DEFAULT 0 CHECK (amount_refunded >= 0),
    ADD COLUMN amount_refunding numeric(19,4) NOT NULL DEFAULT 0 CHECK (amount_refunding >= 0),
    ADD COLUMN authorization_expires_at timestamptz,
    ADD CONSTRAINT payments_refunds_within_captured
        CHECK (amount_refunded + amount_refunding <= amount_captured),
    -- The reconciler looks at a payment while its charge is unknown and, later, to watch its
    -- authorization; never at one that nothing is pending on.
    ADD CONSTRAINT payments_check_only_when_watched
        CHECK (next_check_at IS NULL OR status IN ('processing', 'requires_capture'));
UPDATE payments SET amount_captured = amount WHERE status = 'succeeded';

-- At most one live payment per order: processing, authorized, or succeeded.
DROP INDEX payments_one_active_per_order;
CREATE UNIQUE INDEX payments_one_active_per_order
    ON payments (account_id, order_id) WHERE status IN ('processing', 'requires_capture', 'succeeded');

DROP INDEX payments_due;
CREATE INDEX payments_due ON payments (next_check_at) WHERE next_check_at IS NOT NULL;

-- Captures and voids of an authorization. One in flight per payment at a time.
CREATE TABLE payment_operations (
    account_id      uuid          NOT NULL,
    id              uuid          NOT NULL,
    payment_id      uuid          NOT NULL,
    kind            text          NOT NULL CHECK (kind IN ('capture', 'void')),
    status          text          NOT NULL CHECK (status IN ('processing', 'succeeded', 'failed')),
    -- A capture's amount (the rest of the authorization is released); NULL for a void.
    amount          numeric(19,4) CHECK (amount > 0),
    failure_code    text,
    failure_message text,
    idempotency_key text,
    attempts        integer       NOT NULL DEFAULT 0,
    next_check_at   timestamptz,
    last_error      text,
    lease_until     timestamptz,
    lease_id        uuid,
    last_send_at    timestamptz,
    answer_status   smallint,
    answer_body     bytea,
    created_at      timestamptz   NOT NULL,
    updated_at      timestamptz   NOT NULL,
    PRIMARY KEY (account_id, id),
    FOREIGN KEY (account_id, payment_id) REFERENCES payments (account_id, id),
    CHECK ((status = 'processing') = (next_check_at IS NOT NULL)),
    CHECK ((answer_status IS NULL) = (answer_body IS NULL))
);
CREATE UNIQUE INDEX payment_operations_one_in_flight
    ON payment_operations (account_id, payment_id) WHERE status = 'processing';
CREATE INDEX payment_operations_due ON payment_operations (next_check_at) WHERE status = 'processing';

-- Refunds: money given back on a payment.
CREATE TABLE refunds (
    account_id         uuid          NOT NULL,
    id                 uuid          NOT NULL,
    payment_id         uuid          NOT NULL,
    order_id           uuid          NOT NULL,
    status             text          NOT NULL CHECK (status IN ('processing', 'succeeded', 'failed')),
    amount             numeric(19,4) NOT NULL CHECK (amount > 0),
    currency           text          NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    reason             text CHECK (reason IN ('requested_by_customer', 'duplicate', 'fraudulent')),
    provider_refund_id text,
    failure_code       text,
    failure_message    text,
    -- The client's key that asked for it; NULL for a refund the system starts itself.
    idempotency_key    text,
    attempts           integer       NOT NULL DEFAULT 0,
    next_check_at      timestamptz,
    last_error         text,
    lease_until        timestamptz,
    lease_id           uuid,
    last_send_at       timestamptz,
    answer_status      smallint,
    answer_body        bytea,
    created_at         timestamptz   NOT NULL,
    updated_at         timestamptz   NOT NULL,
    PRIMARY KEY (account_id, id),
    FOREIGN KEY (account_id, payment_id) REFERENCES payments (account_id, id),
    CHECK ((status = 'processing') = (next_check_at IS NOT NULL)),
    CHECK ((answer_status IS NULL) = (answer_body IS NULL))
);
-- A payment's refunds, newest first (UUIDv7 ids sort by creation).
CREATE INDEX refunds_by_payment ON refunds (account_id, payment_id, id);
CREATE INDEX refunds_due ON refunds (next_check_at) WHERE status = 'processing';

-- Keys now also start captures, voids and refunds.
ALTER TABLE idempotency_keys DROP CONSTRAINT idempotency_keys_resource_kind_check;
ALTER TABLE idempotency_keys ADD CONSTRAINT idempotency_keys_resource_kind_check
    CHECK (resource_kind IN ('order', 'payment', 'payment_operation', 'refund'));

-- The audit trail covers every operation on a payment: what moved (the payment itself, a
-- capture, a void, a refund), its id, and who moved it.
ALTER TABLE payment_events
    ADD COLUMN subject text NOT NULL DEFAULT 'payment'
        CHECK (subject IN ('payment', 'capture', 'void', 'refund')),
    ADD COLUMN subject_id uuid;
UPDATE payment_events SET subject_id = payment_id;
ALTER TABLE payment_events ALTER COLUMN subject_id SET NOT NULL;
ALTER TABLE payment_events ALTER COLUMN subject DROP DEFAULT;
ALTER TABLE payment_events DROP CONSTRAINT payment_events_actor_check;
ALTER TABLE payment_events ADD CONSTRAINT payment_events_actor_check
    CHECK (actor IN ('request', 'reconciler', 'webhook', 'operator', 'system'));
