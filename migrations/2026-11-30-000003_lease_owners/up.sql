-- Leases get an owner: whoever claims or takes over an in-progress key writes a fresh lease_id,
-- and only that owner may release the lease. A slow request whose lease ran out and was taken
-- over can no longer clear its successor's lease.
ALTER TABLE idempotency_keys ADD COLUMN lease_id uuid;

-- In-progress keys are few; this index serves the "keys past their lease" gauge and the
-- reconciler's check for live leases.
CREATE INDEX idempotency_keys_in_progress ON idempotency_keys (locked_until) WHERE state = 'in_progress';
