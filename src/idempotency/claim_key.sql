-- Claims an Idempotency-Key: the first statement part of every statement that starts a keyed
-- operation (it is prepended to them), and, alone, the claim of a keyed transaction.
-- The key row is inserted unless the key exists; a concurrent copy waits here on the primary
-- key until the first commits or rolls back. With no key ($2 NULL) nothing is inserted.
-- The row is written once: with its answer when the answer is known now ($8 to $10, a local
-- operation), or naming the provider operation whose row will hold the answer ($6, $7). An
-- answer whose body is also an event's data (a new order's: its `order.created` event) names
-- that event ($97) and leaves the body to it: one copy of the bytes, never changed.
-- Parameters: 1 account, 2 key, 3 method, 4 route, 5 fingerprint, 6 resource kind,
-- 7 resource id, 8 answer status, 9 answer headers, 10 answer body, 11 now, 12 expires at,
-- 97 the event whose data is the answer's body.
WITH claimed AS (
    INSERT INTO idempotency_keys (account_id, key, method, route, fingerprint, resource_kind,
        resource_id, response_status, response_headers, response_body, answer_event_id,
        created_at, expires_at)
    SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, CASE WHEN $97::uuid IS NULL THEN $10 END, $97,
        $11, $12
    WHERE $2::text IS NOT NULL
    ON CONFLICT DO NOTHING
    RETURNING 1
)
