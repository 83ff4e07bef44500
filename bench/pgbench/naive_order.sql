-- The naive form of a new order (the benchmark's comparison point): one transaction of five
-- statements, the key claimed without its answer and completed by a separate UPDATE. Run with
-- -M prepared -D account_id=<uuid>. Ids derive from a per-transaction random number.
\set n random(1, 9000000000000)
BEGIN;
INSERT INTO idempotency_keys (account_id, key, method, route, fingerprint, resource_kind,
    resource_id, created_at, expires_at)
  VALUES (:account_id::uuid, 'naive-' || :client_id::text || '-' || :n::text, 'POST', '/orders',
    sha256(:n::text::bytea), 'order', md5('o' || :client_id::text || '-' || :n::text)::uuid,
    now(), now() + interval '1 day')
  ON CONFLICT DO NOTHING;
INSERT INTO orders (account_id, id, status, currency, total_amount, customer_id, metadata, created_at, updated_at)
  VALUES (:account_id::uuid, md5('o' || :client_id::text || '-' || :n::text)::uuid, 'pending_payment', 'USD',
    48.48, NULL, '{}', now(), now());
INSERT INTO order_items (account_id, order_id, line_number, sku, quantity, unit_price, amount)
  VALUES (:account_id::uuid, md5('o' || :client_id::text || '-' || :n::text)::uuid, 0, 'tee-black-m', 2, 19.99, 39.98),
         (:account_id::uuid, md5('o' || :client_id::text || '-' || :n::text)::uuid, 1, 'mug', 1, 8.50, 8.50);
UPDATE idempotency_keys SET response_status = 201,
    response_headers = '[["content-type","application/json"]]', response_body = convert_to(repeat('x', 420), 'UTF8')
  WHERE account_id = :account_id::uuid AND key = 'naive-' || :client_id::text || '-' || :n::text;
COMMIT;
