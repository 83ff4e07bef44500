-- The transactional outbox: every state change writes its event in the same transaction (the
-- same statement, on the hot paths), so there is no event for a change that rolled back and no
-- committed change without its event. Relays (merchant webhooks, NATS) read the events in
-- transaction order and keep their own progress; they never read business tables.
CREATE TABLE events (
    account_id uuid        NOT NULL,
    -- A UUIDv7: the id every consumer deduplicates on (webhook-id, Nats-Msg-Id).
    id         uuid        NOT NULL,
    -- Order for the relays: the writing transaction's id, then the order of writing. A
    -- relay reads only events whose transaction is older than every transaction still running
    -- (pg_snapshot_xmin), so an event committed late is never skipped by a relay that has moved
    -- past younger ones.
    txid       xid8        NOT NULL DEFAULT pg_current_xact_id(),
    seq        bigint      GENERATED ALWAYS AS IDENTITY,
    type       text        NOT NULL CHECK (type IN (
        'order.created', 'order.cancelled', 'order.paid', 'order.refunded',
        'order.partially_refunded', 'payment.succeeded', 'payment.failed',
        'payment.requires_capture', 'payment.canceled', 'payment.late_charge_refunded',
        'refund.succeeded', 'refund.failed')),
    -- The resource as GET returns it after the change (JSON).
    data       bytea       NOT NULL,
    created_at timestamptz NOT NULL,
    PRIMARY KEY (account_id, id)
);
CREATE INDEX events_in_commit_order ON events (txid, seq);

-- Each relay's progress: the last event it handed on, in transaction order.
CREATE TABLE relay_cursors (
    relay      text        PRIMARY KEY CHECK (relay IN ('webhooks', 'nats')),
    txid       xid8        NOT NULL DEFAULT '0',
    seq        bigint      NOT NULL DEFAULT 0,
    updated_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO relay_cursors (relay) VALUES ('webhooks'), ('nats');
