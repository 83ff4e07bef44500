-- A new order, as one statement after the key claim of claim_key.sql: one round trip, one
-- transaction. The key row goes in with its stored answer (every byte of the answer is known
-- before the order is written; $7 is the order's id). The order and its items go in if the key
-- was new, or if there is no key ($2 NULL). A key that exists inserts nothing and returns 0;
-- the caller then reads the key row (by then committed: ON CONFLICT waited for it).
-- The `order.created` event goes in with the order (the transactional outbox); its data is the
-- order as created, which is the answer ($10). The key row holds the answer's status and
-- headers and names this event ($97 = $21) for its body, rather than a second copy of it.
-- Parameters after the claim's: 13 currency, 14 total, 15 customer id, 16 metadata,
-- 17-20 the items' skus, quantities, unit prices and amounts, 21 the event's id.
-- bench/run.py runs this same text (with claim_key.sql) under pgbench as the service's ceiling.
, placed AS (
    INSERT INTO orders (account_id, id, status, currency, total_amount, customer_id, metadata,
        created_at, updated_at)
    SELECT $1, $7, 'pending_payment', $13, $14, $15, $16, $11, $11
    WHERE $2::text IS NULL OR EXISTS (SELECT 1 FROM claimed)
    RETURNING id
), lines AS (
    INSERT INTO order_items (account_id, order_id, line_number, sku, quantity, unit_price, amount)
    SELECT $1, placed.id, (line.position - 1)::smallint, line.sku, line.quantity, line.unit_price,
        line.amount
    FROM placed, unnest($17, $18, $19, $20) WITH ORDINALITY
        AS line (sku, quantity, unit_price, amount, position)
), announced AS (
    INSERT INTO events (account_id, id, type, data, created_at)
    SELECT $1, $21, 'order.created', $10, $11 FROM placed
)
SELECT count(*) FROM placed
