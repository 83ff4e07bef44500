-- Provider webhooks: one row per event the provider delivered with a valid signature, keyed by
-- the provider's event id (`webhook-id`, the same on every delivery of one event). The row is
-- written in the same transaction as the event's effect, first (a brand-new row, so it conflicts
-- only with another delivery of the same event, which waits for it and then finds it): a second
-- delivery changes nothing, and an effect that rolls back takes its row with it, so that the
-- provider's retry applies it.
-- The event id is the provider's, unique across every account it serves us for; an event for an
-- object we do not know has no account, so the key is the event id alone.
CREATE TABLE provider_webhooks (
    id          text        PRIMARY KEY CHECK (length(id) BETWEEN 1 AND 255),
    event_type  text        NOT NULL CHECK (length(event_type) BETWEEN 1 AND 255),
    -- The provider's id of the charge or refund the event is about.
    object_id   text        NOT NULL CHECK (length(object_id) <= 255),
    -- What the first delivery did: `applied` (it moved an operation), `stale` (the operation had
    -- settled already, or the event reports no final state), `unknown` (no operation of ours).
    result      text        NOT NULL CHECK (result IN ('received', 'applied', 'stale', 'unknown')),
    -- The operation it was about, when it is ours.
    account_id  uuid,
    subject     text        CHECK (subject IN ('payment', 'capture', 'void', 'refund')),
    subject_id  uuid,
    received_at timestamptz NOT NULL,
    CHECK ((subject IS NULL) = (subject_id IS NULL))
);

-- An event names its operation by id alone (parsed from the downstream key the object carries).
-- Ids are UUIDv7, globally unique, but every primary key leads with account_id: these find the
-- account without a scan.
CREATE INDEX payments_by_id ON payments (id);
CREATE INDEX refunds_by_id ON refunds (id);
