-- A ledger movement's INSERT planned once per connection, and no foreign-key check on it.
--
-- `orderpay_ledger_move` was a SQL function: PostgreSQL keeps no plan of a SQL function's body
-- across queries, so every movement parsed and planned its INSERT (and the occurrence's count)
-- again: the function call cost twice its insert (docs/performance.md). As PL/pgSQL, its
-- INSERT is a prepared plan kept for the session, with `orderpay_uuid_v7` inlined into it once.
--
-- The movement's foreign key to its payment is dropped: a movement is written only by the
-- trigger of its payment's own row (or of a refund or dispute of that payment, whose own
-- foreign key holds the payment), in the statement that settles it, so the payment exists and
-- is locked by that statement; payments are never deleted. The check was one more query per
-- movement that could only ever pass.
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

ALTER TABLE ledger_movements DROP CONSTRAINT ledger_movements_account_id_payment_id_fkey;
