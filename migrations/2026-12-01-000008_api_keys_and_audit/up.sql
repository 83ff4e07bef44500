-- API keys get a life cycle: an account holds several, each created, used and revoked on its
-- own, so that a key can be rotated without downtime (create the new one, deploy it, revoke the
-- old one). Still only the SHA-256 of a key is stored.
CREATE TABLE api_keys (
    id           uuid        PRIMARY KEY,
    account_id   uuid        NOT NULL REFERENCES accounts (id),
    key_hash     bytea       NOT NULL UNIQUE CHECK (length(key_hash) = 32),
    -- `sk_` and the first 8 hex characters of the secret: enough for a person to tell keys apart
    -- in a listing (32 bits of 256), far too little to guess the rest from. NULL for the keys
    -- that existed before this table, whose secret was never stored.
    prefix       text        CHECK (prefix ~ '^sk_[0-9a-f]{8}$'),
    created_at   timestamptz NOT NULL,
    -- Written at most once a minute per key (see accounts::keys::touch), never per request.
    last_used_at timestamptz,
    revoked_at   timestamptz
);
CREATE INDEX api_keys_by_account ON api_keys (account_id, id);

-- Every existing key moves here, with a UUIDv7 made from its account's creation time (48 bits
-- of milliseconds, the version nibble set to 7, the rest random), so that ids keep sorting by
-- creation like every other id.
INSERT INTO api_keys (id, account_id, key_hash, prefix, created_at)
SELECT encode(
           set_bit(set_bit(
               overlay(uuid_send(gen_random_uuid())
                       placing substring(int8send(floor(extract(epoch FROM created_at) * 1000)::bigint) FROM 3)
                       FROM 1 FOR 6),
               52, 1), 53, 1),
           'hex')::uuid,
       id, api_key_hash, NULL, created_at
FROM accounts;

ALTER TABLE accounts DROP COLUMN api_key_hash;

-- One row: bumped by the transaction that revokes a key. Every instance polls it a few times a
-- second and forgets its cached keys when it moves, so that a revoked key is refused everywhere
-- within a second in spite of the authentication cache (see accounts::revocations).
CREATE TABLE api_key_revocations (
    singleton  boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    generation bigint  NOT NULL
);
INSERT INTO api_key_revocations (singleton, generation) VALUES (true, 0);

-- What an idempotency key was, after it expired: the key is free for new use, its metadata is
-- kept here for ORDERPAY_IDEMPOTENCY_AUDIT_DAYS, without the answer (the body may hold personal
-- data, and the business rows keep what was done). The sweeper moves rows here in the statement
-- that deletes them. A key used again after it expired can expire again: each use is a row.
CREATE TABLE idempotency_key_audit (
    account_id      uuid        NOT NULL,
    key             text        NOT NULL,
    method          text        NOT NULL,
    route           text        NOT NULL,
    fingerprint     bytea       NOT NULL,
    resource_kind   text        NOT NULL,
    resource_id     uuid        NOT NULL,
    -- The status stored on the key row (an order's 201, a refusal); NULL when the answer lived
    -- on the operation's row (payments, captures, voids, refunds), which is still there.
    response_status smallint,
    created_at      timestamptz NOT NULL,
    expires_at      timestamptz NOT NULL,
    PRIMARY KEY (account_id, key, created_at)
);
-- The audit sweep deletes rows past the audit retention, oldest first, in batches.
CREATE INDEX idempotency_key_audit_expires_at ON idempotency_key_audit (expires_at);
