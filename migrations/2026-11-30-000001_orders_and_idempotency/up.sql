-- Accounts (tenants). The API key is shown once at creation; only its SHA-256 is stored.
CREATE TABLE accounts (
    id           uuid        PRIMARY KEY,
    name         text        NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    api_key_hash bytea       NOT NULL UNIQUE CHECK (length(api_key_hash) = 32),
    created_at   timestamptz NOT NULL DEFAULT now()
);

-- Every business table is keyed by account_id first: every query is scoped by account, and the
-- schema can later be sharded by account (Citus) with each request staying on one shard.
-- There is no foreign key to accounts on the hot tables: account_id always comes from
-- authentication, accounts are never deleted, and a key-share lock on one account row taken by
-- every concurrent insert would serialise a busy tenant on multixacts.
CREATE TABLE orders (
    account_id   uuid          NOT NULL,
    id           uuid          NOT NULL,
    status       text          NOT NULL
                 CHECK (status IN ('pending_payment', 'paid', 'cancelled')),
    currency     text          NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    total_amount numeric(19,4) NOT NULL CHECK (total_amount >= 0),
    customer_id  text,
    metadata     jsonb         NOT NULL DEFAULT '{}'::jsonb,
    created_at   timestamptz   NOT NULL,
    updated_at   timestamptz   NOT NULL,
    -- UUIDv7 ids are time-ordered, so this key also serves "newest first" listing per account.
    PRIMARY KEY (account_id, id)
);

CREATE TABLE order_items (
    account_id  uuid          NOT NULL,
    order_id    uuid          NOT NULL,
    line_number smallint      NOT NULL CHECK (line_number >= 0),
    sku         text          NOT NULL CHECK (length(sku) BETWEEN 1 AND 64),
    quantity    integer       NOT NULL CHECK (quantity BETWEEN 1 AND 10000),
    unit_price  numeric(19,4) NOT NULL CHECK (unit_price >= 0),
    amount      numeric(19,4) NOT NULL CHECK (amount >= 0),
    PRIMARY KEY (account_id, order_id, line_number),
    FOREIGN KEY (account_id, order_id) REFERENCES orders (account_id, id) ON DELETE CASCADE
);

-- One row per (account, Idempotency-Key): the primary key is what makes the first writer win,
-- across any number of service instances. See IDEMPOTENCY.md.
CREATE TABLE idempotency_keys (
    account_id       uuid        NOT NULL,
    key              text        NOT NULL CHECK (length(key) BETWEEN 1 AND 255),
    -- What the key is bound to: a reuse with another method, route or body is refused.
    method           text        NOT NULL,
    route            text        NOT NULL,
    fingerprint      bytea       NOT NULL CHECK (length(fingerprint) = 32),
    state            text        NOT NULL CHECK (state IN ('in_progress', 'completed')),
    -- Multi-step operations (payments) hold a lease while they call the outside world; a retry
    -- after the lease expired may take the key over and resume from recovery_point.
    locked_until     timestamptz,
    recovery_point   text        NOT NULL DEFAULT 'started',
    resource_id      uuid,
    -- The stored answer, replayed byte for byte.
    response_status  smallint,
    response_headers jsonb,
    response_body    bytea,
    created_at       timestamptz NOT NULL DEFAULT now(),
    expires_at       timestamptz NOT NULL,
    PRIMARY KEY (account_id, key),
    CHECK (state <> 'completed' OR (response_status IS NOT NULL AND response_body IS NOT NULL))
);

-- The sweeper deletes expired rows in bounded batches, oldest first.
CREATE INDEX idempotency_keys_expires_at ON idempotency_keys (expires_at);
