-- Merchant webhooks: endpoints a merchant registers, one delivery per (event, endpoint) that the
-- webhooks relay writes in the round that hands the event on, and every attempt to send it.

-- An endpoint of an account. Its signing secret is stored encrypted (AES-256-GCM under
-- ORDERPAY_ENCRYPTION_KEY, with the account and endpoint ids as associated data), never in clear.
-- A deleted endpoint keeps its row (its deliveries and attempts name it) and loses its secrets.
CREATE TABLE webhook_endpoints (
    account_id                 uuid        NOT NULL,
    id                         uuid        NOT NULL,
    url                        text        NOT NULL CHECK (length(url) BETWEEN 1 AND 2048),
    description                text        CHECK (length(description) <= 500),
    -- '{*}' (every type) or the event types the endpoint receives.
    enabled_events             text[]      NOT NULL CHECK (
        cardinality(enabled_events) >= 1 AND enabled_events <@ ARRAY[
            '*', 'order.created', 'order.cancelled', 'order.paid', 'order.refunded',
            'order.partially_refunded', 'payment.succeeded', 'payment.failed',
            'payment.requires_capture', 'payment.canceled', 'payment.late_charge_refunded',
            'refund.succeeded', 'refund.failed']::text[]),
    -- version byte, nonce, ciphertext and tag of `whsec_...`
    secret                     bytea,
    -- The secret before the last rotation, still signing until previous_secret_expires_at.
    previous_secret            bytea,
    previous_secret_expires_at timestamptz,
    created_at                 timestamptz NOT NULL,
    updated_at                 timestamptz NOT NULL,
    deleted_at                 timestamptz,
    PRIMARY KEY (account_id, id),
    CHECK ((deleted_at IS NULL) = (secret IS NOT NULL)),
    CHECK ((previous_secret IS NULL) = (previous_secret_expires_at IS NULL))
);

-- One delivery of one event to one endpoint: pending until a 2xx (delivered), the last attempt
-- (failed), or its endpoint's deletion (canceled). The relay writes one per (event, matching
-- endpoint) in the round that hands the event on ('outbox', at most once each: a batch handed on
-- again inserts nothing twice); `orderpay events redeliver` writes more ('redeliver').
-- A worker holds a delivery while it sends it: lease_id and lease_until, with next_attempt_at
-- moved to the lease's end, so that a delivery whose worker died is due again then.
CREATE TABLE webhook_deliveries (
    account_id      uuid        NOT NULL,
    id              uuid        NOT NULL,
    endpoint_id     uuid        NOT NULL,
    event_id        uuid        NOT NULL,
    origin          text        NOT NULL CHECK (origin IN ('outbox', 'redeliver')),
    status          text        NOT NULL CHECK (status IN ('pending', 'delivered', 'failed', 'canceled')),
    -- Claims made so far, each one an attempt.
    attempts        integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    next_attempt_at timestamptz,
    lease_until     timestamptz,
    lease_id        uuid,
    -- What the last attempt saw; failing_since is the first failed attempt's start.
    last_attempt_at timestamptz,
    last_status     smallint,
    last_error      text,
    failing_since   timestamptz,
    created_at      timestamptz NOT NULL,
    updated_at      timestamptz NOT NULL,
    PRIMARY KEY (account_id, id),
    FOREIGN KEY (account_id, endpoint_id) REFERENCES webhook_endpoints (account_id, id),
    CHECK ((status = 'pending') = (next_attempt_at IS NOT NULL)),
    CHECK ((lease_id IS NULL) = (lease_until IS NULL))
);
CREATE UNIQUE INDEX webhook_deliveries_once_per_event
    ON webhook_deliveries (account_id, endpoint_id, event_id) WHERE origin = 'outbox';
-- An endpoint's deliveries (stopped when it is deleted; a delivered copy of a given-up event).
CREATE INDEX webhook_deliveries_by_endpoint ON webhook_deliveries (account_id, endpoint_id, event_id);
-- The workers' queue.
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at) WHERE status = 'pending';
-- `orderpay webhooks failing`.
CREATE INDEX webhook_deliveries_failing ON webhook_deliveries (failing_since)
    WHERE failing_since IS NOT NULL AND status IN ('pending', 'failed');

-- Every attempt to send a delivery, recorded with its outcome whether or not the worker still
-- held the delivery when the answer came.
CREATE TABLE webhook_delivery_attempts (
    account_id  uuid        NOT NULL,
    delivery_id uuid        NOT NULL,
    attempt     integer     NOT NULL CHECK (attempt >= 1),
    started_at  timestamptz NOT NULL,
    -- NULL: no HTTP answer (timeout, connection refused, address not allowed).
    http_status smallint,
    latency_ms  integer     NOT NULL CHECK (latency_ms >= 0),
    error       text        CHECK (length(error) <= 500),
    PRIMARY KEY (account_id, delivery_id, attempt),
    FOREIGN KEY (account_id, delivery_id) REFERENCES webhook_deliveries (account_id, id)
);

-- Creating an endpoint and rotating its secret take Idempotency-Keys; their answers are on the
-- key row, as an order's.
ALTER TABLE idempotency_keys DROP CONSTRAINT idempotency_keys_resource_kind_check;
ALTER TABLE idempotency_keys ADD CONSTRAINT idempotency_keys_resource_kind_check
    CHECK (resource_kind IN ('order', 'payment', 'payment_operation', 'refund', 'webhook_endpoint'));
