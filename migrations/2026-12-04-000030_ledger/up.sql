-- The books: a double-entry ledger of every money movement (docs/books.md).
--
-- A movement moves `amount` from one ledger account to another: it debits `debit_account` and
-- credits `credit_account` by the same amount, so every movement balances by construction (as
-- TigerBeetle's transfers do). Ledger accounts exist per (orderpay account, currency):
--   provider_balance   what the provider holds for the merchant (an asset: a debit adds);
--   customer_payments  what customers paid (a credit adds);
--   refunds            what was given back to customers (a debit adds);
--   disputes           what customers' banks took back (a debit adds);
--   late_charges       charges that landed on payments we had told the customer failed: owed
--                      back until their system refund succeeds (a credit adds).
-- Movements are written by triggers on the two columns that hold our money (a payment's
-- `amount_captured`, a refund's `status`), in the very statement that settles them: every path
-- that moves money (a request, the reconciler, a webhook, an operator, a correction) writes
-- its movement, and a settle that changes nothing writes nothing (the triggers fire on a change
-- of the column only). Each movement is unique per (operation, type, occurrence); a correction
-- is a new movement, never an update: movements are immutable.
CREATE TABLE ledger_movements (
    account_id uuid NOT NULL,
    id uuid NOT NULL,
    type text NOT NULL CHECK (type IN ('charge_captured', 'refund', 'refund_reversal',
        'refund_correction', 'late_charge', 'late_charge_refund', 'dispute_withdrawal',
        'dispute_reinstatement')),
    -- The payment or refund whose settle moved the money.
    operation_id uuid NOT NULL,
    payment_id uuid NOT NULL,
    order_id uuid NOT NULL,
    debit_account text NOT NULL CHECK (debit_account IN ('provider_balance', 'customer_payments',
        'refunds', 'disputes', 'late_charges')),
    credit_account text NOT NULL CHECK (credit_account IN ('provider_balance',
        'customer_payments', 'refunds', 'disputes', 'late_charges')),
    amount numeric NOT NULL CHECK (amount > 0),
    currency text NOT NULL,
    created_at timestamptz NOT NULL,
    -- The how-manieth movement of this type for the operation: 1, unless the provider moved the
    -- same money back and forth (a refund reversed, corrected, reversed again).
    occurrence int NOT NULL DEFAULT 1 CHECK (occurrence >= 1),
    PRIMARY KEY (account_id, id),
    FOREIGN KEY (account_id, payment_id) REFERENCES payments (account_id, id),
    UNIQUE (operation_id, type, occurrence),
    CHECK (debit_account <> credit_account)
);
CREATE INDEX ledger_movements_by_payment ON ledger_movements (account_id, payment_id);
CREATE INDEX ledger_movements_by_order ON ledger_movements (account_id, order_id);

-- A time-ordered id (UUIDv7, as the service makes them) for a movement written at `at`.
CREATE FUNCTION orderpay_uuid_v7(at timestamptz) RETURNS uuid LANGUAGE sql VOLATILE AS $$
    SELECT encode(set_bit(set_bit(overlay(uuid_send(gen_random_uuid())
        PLACING substring(int8send(floor(extract(epoch FROM at) * 1000)::bigint) FROM 3)
        FROM 1 FOR 6), 52, 1), 53, 1), 'hex')::uuid
$$;

CREATE FUNCTION orderpay_ledger_move(account uuid, kind text, operation uuid, payment uuid,
    order_id uuid, debit text, credit text, amount numeric, currency text, at timestamptz)
RETURNS void LANGUAGE sql AS $$
    -- Called from a trigger of the operation's own row, under its row lock: two movements of one
    -- operation are never counted at once.
    INSERT INTO ledger_movements (account_id, id, type, operation_id, payment_id, order_id,
        debit_account, credit_account, amount, currency, created_at, occurrence)
    VALUES (account, orderpay_uuid_v7(at), kind, operation, payment, order_id, debit, credit,
        amount, currency, at,
        1 + (SELECT count(*) FROM ledger_movements AS m
             WHERE m.operation_id = operation AND m.type = kind))
$$;

-- A payment's captured amount grew: its charge or capture succeeded (`charge_captured`), or a
-- charge landed on it after it failed (`late_charge`, recorded with `late_charge_amount`).
-- The captured amount never shrinks; if it ever did, `orderpay ledger check` reports the payment.
CREATE FUNCTION orderpay_ledger_payment() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    late boolean := NEW.late_charge_amount IS NOT NULL AND OLD.late_charge_amount IS NULL;
BEGIN
    IF NEW.amount_captured > OLD.amount_captured THEN
        PERFORM orderpay_ledger_move(NEW.account_id,
            CASE WHEN late THEN 'late_charge' ELSE 'charge_captured' END, NEW.id, NEW.id,
            NEW.order_id, 'provider_balance',
            CASE WHEN late THEN 'late_charges' ELSE 'customer_payments' END,
            NEW.amount_captured - OLD.amount_captured, NEW.currency, NEW.updated_at);
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER payments_ledger AFTER UPDATE OF amount_captured ON payments
    FOR EACH ROW WHEN (NEW.amount_captured IS DISTINCT FROM OLD.amount_captured)
    EXECUTE FUNCTION orderpay_ledger_payment();

-- A refund's money moved: it succeeded (`refund`; `late_charge_refund` for the system's refund
-- of a late charge, the one without a client's key), a refund given up on turned out carried out
-- (`refund_correction`), or one that succeeded was reversed (`refund_reversal`).
CREATE FUNCTION orderpay_ledger_refund() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    given_back text := CASE WHEN NEW.idempotency_key IS NULL THEN 'late_charges' ELSE 'refunds' END;
BEGIN
    IF NEW.status = 'succeeded' AND OLD.status IN ('processing', 'failed') THEN
        PERFORM orderpay_ledger_move(NEW.account_id,
            CASE WHEN OLD.status = 'failed' THEN 'refund_correction'
                 WHEN NEW.idempotency_key IS NULL THEN 'late_charge_refund' ELSE 'refund' END,
            NEW.id, NEW.payment_id, NEW.order_id, given_back, 'provider_balance', NEW.amount,
            NEW.currency, NEW.updated_at);
    ELSIF OLD.status = 'succeeded' AND NEW.status = 'failed' THEN
        PERFORM orderpay_ledger_move(NEW.account_id, 'refund_reversal', NEW.id, NEW.payment_id,
            NEW.order_id, 'provider_balance', given_back, NEW.amount, NEW.currency, NEW.updated_at);
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER refunds_ledger AFTER UPDATE OF status ON refunds
    FOR EACH ROW WHEN (NEW.status IS DISTINCT FROM OLD.status)
    EXECUTE FUNCTION orderpay_ledger_refund();

-- Movements are immutable: a correction is a new movement.
CREATE FUNCTION orderpay_ledger_immutable() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'ledger movements are immutable: write a correcting movement instead'
        USING ERRCODE = 'integrity_constraint_violation';
END
$$;
CREATE TRIGGER ledger_movements_immutable BEFORE UPDATE OR DELETE ON ledger_movements
    FOR EACH ROW EXECUTE FUNCTION orderpay_ledger_immutable();

-- Payments and refunds settled before the ledger existed: their movements, as of now, made as
-- the triggers make them.
SELECT orderpay_ledger_move(account_id,
    CASE WHEN late_charge_amount IS NOT NULL THEN 'late_charge' ELSE 'charge_captured' END,
    id, id, order_id, 'provider_balance',
    CASE WHEN late_charge_amount IS NOT NULL THEN 'late_charges' ELSE 'customer_payments' END,
    amount_captured, currency, updated_at)
FROM payments WHERE amount_captured > 0;
SELECT orderpay_ledger_move(account_id,
    CASE WHEN idempotency_key IS NULL THEN 'late_charge_refund' ELSE 'refund' END,
    id, payment_id, order_id,
    CASE WHEN idempotency_key IS NULL THEN 'late_charges' ELSE 'refunds' END,
    'provider_balance', amount, currency, updated_at)
FROM refunds WHERE status = 'succeeded';
