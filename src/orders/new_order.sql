-- One new order with its idempotency key, as one statement: one round trip, one transaction.
-- The key row goes in already completed with its stored answer (every byte of the answer is
-- known before the order is written); the order and its items go in only if the key was new.
-- A key that exists inserts nothing and returns 0 with the existing key row, so that a replay
-- costs this one round trip and no commit. (A copy racing this one is waited for by ON CONFLICT,
-- but its row committed after this statement began is not visible here: then the row comes back
-- empty and the caller takes the general path of idempotency::store.)
-- Parameters: 1 account, 2 key, 3 method, 4 route, 5 fingerprint, 6 response body,
-- 7 response headers, 8 now, 9 expires at, 10 order id, 11 currency, 12 total, 13 customer id,
-- 14 metadata, 15-18 the items' skus, quantities, unit prices and amounts, 19 response status.
-- bench/run.py runs this same text under pgbench as the service's ceiling.
WITH claimed AS (
    INSERT INTO idempotency_keys (account_id, key, method, route, fingerprint, state, recovery_point,
        resource_id, response_status, response_headers, response_body, created_at, expires_at)
    VALUES ($1, $2, $3, $4, $5, 'completed', 'finished', $10, $19, $7, $6, $8, $9)
    ON CONFLICT DO NOTHING
    RETURNING 1
), placed AS (
    INSERT INTO orders (account_id, id, status, currency, total_amount, customer_id, metadata,
        created_at, updated_at)
    SELECT $1, $10, 'pending_payment', $11, $12, $13, $14, $8, $8
    WHERE EXISTS (SELECT 1 FROM claimed)
    RETURNING id
), lines AS (
    INSERT INTO order_items (account_id, order_id, line_number, sku, quantity, unit_price, amount)
    SELECT $1, placed.id, (line.position - 1)::smallint, line.sku, line.quantity, line.unit_price,
        line.amount
    FROM placed, unnest($15, $16, $17, $18) WITH ORDINALITY
        AS line (sku, quantity, unit_price, amount, position)
)
SELECT outcome.claimed, existing.account_id, existing.key, existing.method, existing.route,
    existing.fingerprint, existing.state, existing.locked_until, existing.recovery_point,
    existing.resource_id, existing.response_status, existing.response_headers,
    existing.response_body, existing.created_at, existing.expires_at, existing.lease_id
FROM (SELECT count(*) AS claimed FROM claimed) AS outcome
LEFT JOIN idempotency_keys AS existing
    ON outcome.claimed = 0 AND existing.account_id = $1 AND existing.key = $2
