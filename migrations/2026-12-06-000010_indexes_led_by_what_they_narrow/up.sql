-- Secondary indexes led by the column they narrow by (the order, the payment, the dispute, the
-- endpoint), not by `account_id`.
--
-- Led by `account_id`, each of them could stand in for its table's primary key
-- `(account_id, id)` in a lookup by key: `account_id = $1` is a condition on its first column
-- too, the rest a filter. On a small table the planner prices both the same, or the smaller
-- partial index lower, and a generic plan made then is kept for the connection's life: the
-- settle of every payment (`status = 'processing'` implies `payments_one_active_per_order`'s
-- predicate) then walked the account's live payments, 1,700 buffers a call in the benchmark,
-- and the foreign-key check for every row referencing a payment walked
-- `payments_by_order`. Led by another column, an index serves only the lookups that name it,
-- and there both columns narrow it. Uniqueness is the same in any column order.
DROP INDEX payments_by_order;
CREATE INDEX payments_by_order ON payments (order_id, account_id, id);

-- The partial unique indexes hold the parent's id alone. With `account_id` in any position a
-- lookup by key could walk them (a full scan of a partial index is priced small while the table
-- is), and `payments_one_active_per_order` holds every succeeded payment: every settle walked
-- the account's. The ids are ours (UUIDv7, made by orderpay), unique across accounts, so
-- unique per id is unique per (account, id).
DROP INDEX payments_one_active_per_order;
CREATE UNIQUE INDEX payments_one_active_per_order
    ON payments (order_id) WHERE status IN ('processing', 'requires_capture', 'succeeded');

DROP INDEX payment_operations_one_in_flight;
CREATE UNIQUE INDEX payment_operations_one_in_flight
    ON payment_operations (payment_id) WHERE status = 'processing';

DROP INDEX refunds_by_payment;
CREATE INDEX refunds_by_payment ON refunds (payment_id, account_id, id);

DROP INDEX ledger_movements_by_payment;
CREATE INDEX ledger_movements_by_payment ON ledger_movements (payment_id, account_id);
DROP INDEX ledger_movements_by_order;
CREATE INDEX ledger_movements_by_order ON ledger_movements (order_id, account_id);

DROP INDEX disputes_by_payment;
CREATE INDEX disputes_by_payment ON disputes (payment_id, account_id);

DROP INDEX dispute_responses_one_in_flight;
CREATE UNIQUE INDEX dispute_responses_one_in_flight
    ON dispute_responses (dispute_id) WHERE status = 'processing';

DROP INDEX webhook_deliveries_once_per_event;
CREATE UNIQUE INDEX webhook_deliveries_once_per_event
    ON webhook_deliveries (endpoint_id, account_id, event_id) WHERE origin = 'outbox';
DROP INDEX webhook_deliveries_by_endpoint;
CREATE INDEX webhook_deliveries_by_endpoint ON webhook_deliveries (endpoint_id, account_id, event_id);
