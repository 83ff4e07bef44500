-- A provider operation (today: a payment's charge) holds what moves while it runs: the lease of
-- whoever drives it, when it last sent a request to the provider, and, once settled, its final
-- answer. Its idempotency key row is then written once and never updated: it binds the key to
-- the request and names the operation whose answer it replays.

ALTER TABLE payments
    ADD COLUMN lease_until   timestamptz,
    ADD COLUMN lease_id      uuid,
    -- Database time (clock_timestamp()) at which the last charge request was about to be sent.
    -- The reconciler gives up on a payment the provider never received only once this is older
    -- than the provider timeout plus a margin: a send still in flight could yet land.
    ADD COLUMN last_send_at  timestamptz,
    -- The final answer for the payment's Idempotency-Key, byte for byte (headers follow from
    -- the status: see payments::representation).
    ADD COLUMN answer_status smallint,
    ADD COLUMN answer_body   bytea,
    ADD CHECK ((answer_status IS NULL) = (answer_body IS NULL));

-- Leases held on in-progress keys move to their payments.
UPDATE payments AS p
SET lease_until = k.locked_until, lease_id = k.lease_id
FROM idempotency_keys AS k
WHERE k.account_id = p.account_id AND k.key = p.idempotency_key AND k.resource_id = p.id
    AND k.state = 'in_progress' AND p.status = 'processing';

-- The kind of resource a key created or acted on. A key row holds its answer itself (orders,
-- cancels, refusals), or names a provider operation whose row holds it (resource_kind
-- 'payment' with no response here).
ALTER TABLE idempotency_keys ADD COLUMN resource_kind text;
UPDATE idempotency_keys
SET resource_kind = CASE WHEN route = '/payments' THEN 'payment' ELSE 'order' END;
ALTER TABLE idempotency_keys
    ALTER COLUMN resource_kind SET NOT NULL,
    ALTER COLUMN resource_id SET NOT NULL,
    ADD CHECK (resource_kind IN ('order', 'payment'));

DROP INDEX idempotency_keys_in_progress;
ALTER TABLE idempotency_keys
    DROP CONSTRAINT idempotency_keys_check,
    DROP CONSTRAINT idempotency_keys_state_check,
    DROP COLUMN state,
    DROP COLUMN locked_until,
    DROP COLUMN lease_id,
    DROP COLUMN recovery_point;

-- The reconciler's claim skips payments whose lease is held; this index serves the
-- "operations past their lease" gauge.
CREATE INDEX payments_leased ON payments (lease_until) WHERE status = 'processing';
