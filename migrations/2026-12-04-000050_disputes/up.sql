-- Disputes (docs/books.md, docs/payments.md): a customer's bank takes a captured payment's money
-- back, and may give it back. Recorded from the provider's word only (a webhook verified by a
-- lookup, or the reconciler's listing), one row per provider dispute.
CREATE TABLE disputes (
    account_id uuid NOT NULL,
    id uuid NOT NULL,
    payment_id uuid NOT NULL,
    order_id uuid NOT NULL,
    provider_dispute_id text NOT NULL UNIQUE,
    amount numeric(19,4) NOT NULL CHECK (amount > 0),
    currency text NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    reason text NOT NULL,
    status text NOT NULL CHECK (status IN ('warning_needs_response', 'warning_under_review',
        'warning_closed', 'needs_response', 'under_review', 'won', 'lost')),
    closed_reason text CHECK (closed_reason IN ('accepted', 'evidence_not_submitted', 'decided')),
    evidence_due_by timestamptz,
    -- What the provider withdrew from the merchant's balance for it, and gave back: they only
    -- grow, and the ledger's movements follow them (the trigger below).
    amount_withdrawn numeric(19,4) NOT NULL DEFAULT 0 CHECK (amount_withdrawn >= 0),
    amount_reinstated numeric(19,4) NOT NULL DEFAULT 0 CHECK (amount_reinstated >= 0),
    -- When the provider opened it.
    provider_created_at timestamptz NOT NULL,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    PRIMARY KEY (account_id, id),
    FOREIGN KEY (account_id, payment_id) REFERENCES payments (account_id, id),
    CHECK (amount_reinstated <= amount_withdrawn AND amount_withdrawn <= amount),
    CHECK ((closed_reason IS NOT NULL) = (status IN ('won', 'lost', 'warning_closed')))
);
CREATE INDEX disputes_by_payment ON disputes (account_id, payment_id);
-- The evidence due soonest first, for the open ones (`GET /disputes?due_before=`, the alert).
CREATE INDEX disputes_due ON disputes (evidence_due_by)
    WHERE status IN ('warning_needs_response', 'needs_response');

-- A dispute names the provider's charge: its payment is found by it, with no scan.
CREATE INDEX payments_by_provider_charge ON payments (provider_charge_id)
    WHERE provider_charge_id IS NOT NULL;

-- What disputes withdrew from a payment and did not reinstate: no longer refundable.
ALTER TABLE payments
    ADD COLUMN amount_disputed numeric(19,4) NOT NULL DEFAULT 0 CHECK (amount_disputed >= 0),
    DROP CONSTRAINT payments_refunds_within_captured,
    ADD CONSTRAINT payments_refunds_within_captured
        CHECK (amount_refunded + amount_refunding + amount_disputed <= amount_captured);

-- Where the reconciler's listing of the provider's disputes starts next: the provider's
-- creation time of the oldest dispute it may still lack; and when an instance last claimed the
-- listing (one instance lists per minute, whatever the reconcilers' interval). One row.
CREATE TABLE dispute_listing (
    id boolean PRIMARY KEY DEFAULT true CHECK (id),
    created_from timestamptz NOT NULL,
    listed_at timestamptz
);
INSERT INTO dispute_listing (created_from) VALUES (now());

-- A dispute's money moved: the funds were withdrawn (`dispute_withdrawal`) or reinstated
-- (`dispute_reinstatement`); the operation is the dispute, the payment its payment.
CREATE FUNCTION orderpay_ledger_dispute() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    withdrawn numeric := NEW.amount_withdrawn
        - CASE WHEN TG_OP = 'INSERT' THEN 0 ELSE OLD.amount_withdrawn END;
    reinstated numeric := NEW.amount_reinstated
        - CASE WHEN TG_OP = 'INSERT' THEN 0 ELSE OLD.amount_reinstated END;
BEGIN
    IF withdrawn > 0 THEN
        PERFORM orderpay_ledger_move(NEW.account_id, 'dispute_withdrawal', NEW.id, NEW.payment_id,
            NEW.order_id, 'disputes', 'provider_balance', withdrawn, NEW.currency, NEW.updated_at);
    END IF;
    IF reinstated > 0 THEN
        PERFORM orderpay_ledger_move(NEW.account_id, 'dispute_reinstatement', NEW.id,
            NEW.payment_id, NEW.order_id, 'provider_balance', 'disputes', reinstated, NEW.currency,
            NEW.updated_at);
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER disputes_ledger_insert AFTER INSERT ON disputes
    FOR EACH ROW EXECUTE FUNCTION orderpay_ledger_dispute();
CREATE TRIGGER disputes_ledger AFTER UPDATE OF amount_withdrawn, amount_reinstated ON disputes
    FOR EACH ROW WHEN (NEW.amount_withdrawn IS DISTINCT FROM OLD.amount_withdrawn
        OR NEW.amount_reinstated IS DISTINCT FROM OLD.amount_reinstated)
    EXECUTE FUNCTION orderpay_ledger_dispute();

-- A provider webhook's row names the dispute it was about.
ALTER TABLE provider_webhooks DROP CONSTRAINT provider_webhooks_subject_check,
    ADD CONSTRAINT provider_webhooks_subject_check
        CHECK (subject IN ('payment', 'capture', 'void', 'refund', 'dispute'));

-- The `dispute.*` events of the outbox.
ALTER TABLE events DROP CONSTRAINT events_type_check,
    ADD CONSTRAINT events_type_check CHECK (type IN (
        'order.created', 'order.cancelled', 'order.paid', 'order.refunded',
        'order.partially_refunded', 'payment.succeeded', 'payment.failed',
        'payment.requires_capture', 'payment.canceled', 'payment.late_charge_refunded',
        'refund.succeeded', 'refund.failed', 'dispute.created', 'dispute.updated',
        'dispute.funds_withdrawn', 'dispute.funds_reinstated', 'dispute.closed'));
