ALTER TABLE ledger_movements ADD FOREIGN KEY (account_id, payment_id) REFERENCES payments (account_id, id);

CREATE OR REPLACE FUNCTION orderpay_ledger_move(account uuid, kind text, operation uuid, payment uuid,
    order_id uuid, debit text, credit text, amount numeric, currency text, at timestamptz)
RETURNS void LANGUAGE sql AS $$
    INSERT INTO ledger_movements (account_id, id, type, operation_id, payment_id, order_id,
        debit_account, credit_account, amount, currency, created_at, occurrence)
    VALUES (account, orderpay_uuid_v7(at), kind, operation, payment, order_id, debit, credit,
        amount, currency, at,
        1 + (SELECT count(*) FROM ledger_movements AS m
             WHERE m.operation_id = operation AND m.type = kind))
$$;
