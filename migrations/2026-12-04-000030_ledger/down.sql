DROP TRIGGER refunds_ledger ON refunds;
DROP TRIGGER payments_ledger ON payments;
DROP TABLE ledger_movements;
DROP FUNCTION orderpay_ledger_immutable();
DROP FUNCTION orderpay_ledger_refund();
DROP FUNCTION orderpay_ledger_payment();
DROP FUNCTION orderpay_ledger_move(uuid, text, uuid, uuid, uuid, text, text, numeric, text, timestamptz);
DROP FUNCTION orderpay_uuid_v7(timestamptz);
