DROP INDEX webhook_deliveries_by_endpoint;
CREATE INDEX webhook_deliveries_by_endpoint ON webhook_deliveries (account_id, endpoint_id, event_id);

DROP INDEX webhook_deliveries_once_per_event;
CREATE UNIQUE INDEX webhook_deliveries_once_per_event
    ON webhook_deliveries (account_id, endpoint_id, event_id) WHERE origin = 'outbox';

DROP INDEX dispute_responses_one_in_flight;
CREATE UNIQUE INDEX dispute_responses_one_in_flight
    ON dispute_responses (account_id, dispute_id) WHERE status = 'processing';

DROP INDEX disputes_by_payment;
CREATE INDEX disputes_by_payment ON disputes (account_id, payment_id);

DROP INDEX ledger_movements_by_order;
CREATE INDEX ledger_movements_by_order ON ledger_movements (account_id, order_id);

DROP INDEX ledger_movements_by_payment;
CREATE INDEX ledger_movements_by_payment ON ledger_movements (account_id, payment_id);

DROP INDEX refunds_by_payment;
CREATE INDEX refunds_by_payment ON refunds (account_id, payment_id, id);

DROP INDEX payment_operations_one_in_flight;
CREATE UNIQUE INDEX payment_operations_one_in_flight
    ON payment_operations (account_id, payment_id) WHERE status = 'processing';

DROP INDEX payments_one_active_per_order;
CREATE UNIQUE INDEX payments_one_active_per_order
    ON payments (account_id, order_id) WHERE status IN ('processing', 'requires_capture', 'succeeded');

DROP INDEX payments_by_order;
CREATE INDEX payments_by_order ON payments (account_id, order_id, id);
