-- No foreign-key check on an order's items: they are written only by the statement that writes
-- their order (src/orders/new_order.sql, `order_id` taken from the order's own RETURNING), and
-- orders are never deleted, so the check (one query per item, run at the end of the statement)
-- could only ever pass. It was 5% of the new-order statement's time (docs/performance.md).
ALTER TABLE order_items DROP CONSTRAINT order_items_account_id_order_id_fkey;
