-- Every unique index of a table keyed by account holds `account_id`, appended as its last key
-- column: the rule Citus sets for a table distributed by `account_id` (docs/scaling.md). A
-- shard holds some accounts' rows and checks uniqueness among them alone, so Citus accepts a
-- unique index only when the distribution column is one of its key columns, and uniqueness
-- within an account is then all it can promise. Nothing is lost: the ids these indexes hold are
-- ours (UUIDv7) or the provider's, each of one account, so unique per id is unique per
-- (id, account).
--
-- Appended, not leading: each index still leads with what it narrows by (the order, the
-- payment, the dispute, the provider's id, the operation), and serves the lookups that name it
-- (migration `indexes_led_by_what_they_narrow`).
--
-- The three partial indexes also name their leading column in their predicate
-- (`order_id IS NOT NULL`, never false: the column is NOT NULL). A partial index is open to any
-- statement whose conditions imply its predicate, and with `account_id` among its columns a
-- lookup by key (`account_id = $1 AND id = $2 AND status = 'processing'`) could scan all of it
-- by `account_id` alone. On a fresh schema that plan is priced like an empty index: ten
-- statements chose it as their generic plan (the settles, `mark_sending` and `release` of the
-- three tables), which a connection keeps, and `payments_one_active_per_order` holds every
-- succeeded payment. Only a condition on the leading column (`order_id = $n`) implies
-- `order_id IS NOT NULL`, so the index serves the lookups that name what it narrows by and no
-- other, as before. `tests/api/database.rs` holds both
-- (`no_statement_is_planned_to_walk_a_whole_account`,
-- `every_table_is_ready_to_be_distributed_by_account`).
DROP INDEX payments_one_active_per_order;
CREATE UNIQUE INDEX payments_one_active_per_order
    ON payments (order_id, account_id)
    WHERE status IN ('processing', 'requires_capture', 'succeeded') AND order_id IS NOT NULL;

DROP INDEX payment_operations_one_in_flight;
CREATE UNIQUE INDEX payment_operations_one_in_flight
    ON payment_operations (payment_id, account_id)
    WHERE status = 'processing' AND payment_id IS NOT NULL;

DROP INDEX dispute_responses_one_in_flight;
CREATE UNIQUE INDEX dispute_responses_one_in_flight
    ON dispute_responses (dispute_id, account_id)
    WHERE status = 'processing' AND dispute_id IS NOT NULL;

-- A provider's dispute belongs to the one payment its charge names, so to one account.
ALTER TABLE disputes
    DROP CONSTRAINT disputes_provider_dispute_id_key,
    ADD CONSTRAINT disputes_provider_dispute_id_key UNIQUE (provider_dispute_id, account_id);

ALTER TABLE ledger_movements
    DROP CONSTRAINT ledger_movements_operation_id_type_occurrence_key,
    ADD CONSTRAINT ledger_movements_operation_id_type_occurrence_key
        UNIQUE (operation_id, type, occurrence, account_id);

-- The occurrence is counted among the movements of the operation's account. On Citus this
-- function runs inside the ledger's triggers on a shard, where only the colocated shards of the
-- same node may be read: a count by operation alone would be a query over every shard, refused
-- there. Named by account, it reads the one shard of the account's movements. Otherwise as
-- migration `ledger_moves_planned_once` wrote it (the count is still served by the unique
-- index: operation, type, then the account).
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
               AND m.type = orderpay_ledger_move.kind
               AND m.account_id = orderpay_ledger_move.account));
END
$$;
