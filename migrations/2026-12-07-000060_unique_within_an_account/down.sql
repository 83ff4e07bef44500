CREATE OR REPLACE FUNCTION orderpay_ledger_move(account uuid, kind text, operation uuid, payment uuid,
    order_id uuid, debit text, credit text, amount numeric, currency text, at timestamptz)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    -- Called from a trigger of the operation's own row, under its row lock: two movements of one
    -- operation are never counted at once.
    INSERT INTO ledger_movements (account_id, id, type, operation_id, payment_id, order_id,
        debit_account, credit_account, amount, currency, created_at, occurrence)
    VALUES (orderpay_ledger_move.account, orderpay_uuid_v7(orderpay_ledger_move.at),
        orderpay_ledger_move.kind, orderpay_ledger_move.operation, orderpay_ledger_move.payment,
        orderpay_ledger_move.order_id, orderpay_ledger_move.debit, orderpay_ledger_move.credit,
        orderpay_ledger_move.amount, orderpay_ledger_move.currency, orderpay_ledger_move.at,
        1 + (SELECT count(*) FROM ledger_movements AS m
             WHERE m.operation_id = orderpay_ledger_move.operation
               AND m.type = orderpay_ledger_move.kind));
END
$$;

ALTER TABLE ledger_movements
    DROP CONSTRAINT ledger_movements_operation_id_type_occurrence_key,
    ADD CONSTRAINT ledger_movements_operation_id_type_occurrence_key
        UNIQUE (operation_id, type, occurrence);

ALTER TABLE disputes
    DROP CONSTRAINT disputes_provider_dispute_id_key,
    ADD CONSTRAINT disputes_provider_dispute_id_key UNIQUE (provider_dispute_id);

DROP INDEX dispute_responses_one_in_flight;
CREATE UNIQUE INDEX dispute_responses_one_in_flight
    ON dispute_responses (dispute_id) WHERE status = 'processing';

DROP INDEX payment_operations_one_in_flight;
CREATE UNIQUE INDEX payment_operations_one_in_flight
    ON payment_operations (payment_id) WHERE status = 'processing';

DROP INDEX payments_one_active_per_order;
CREATE UNIQUE INDEX payments_one_active_per_order
    ON payments (order_id) WHERE status IN ('processing', 'requires_capture', 'succeeded');
