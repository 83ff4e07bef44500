DELETE FROM events WHERE type LIKE 'dispute.%';
ALTER TABLE events DROP CONSTRAINT events_type_check,
    ADD CONSTRAINT events_type_check CHECK (type IN (
        'order.created', 'order.cancelled', 'order.paid', 'order.refunded',
        'order.partially_refunded', 'payment.succeeded', 'payment.failed',
        'payment.requires_capture', 'payment.canceled', 'payment.late_charge_refunded',
        'refund.succeeded', 'refund.failed'));
UPDATE provider_webhooks SET subject = NULL, subject_id = NULL WHERE subject = 'dispute';
ALTER TABLE provider_webhooks DROP CONSTRAINT provider_webhooks_subject_check,
    ADD CONSTRAINT provider_webhooks_subject_check
        CHECK (subject IN ('payment', 'capture', 'void', 'refund'));
DROP TRIGGER disputes_ledger ON disputes;
DROP TRIGGER disputes_ledger_insert ON disputes;
DROP FUNCTION orderpay_ledger_dispute();
DROP TABLE dispute_listing;
-- Movements are immutable while the service runs; going back drops the disputes' own.
ALTER TABLE ledger_movements DISABLE TRIGGER ledger_movements_immutable;
DELETE FROM ledger_movements WHERE type IN ('dispute_withdrawal', 'dispute_reinstatement');
ALTER TABLE ledger_movements ENABLE TRIGGER ledger_movements_immutable;
ALTER TABLE payments
    DROP CONSTRAINT payments_refunds_within_captured,
    ADD CONSTRAINT payments_refunds_within_captured
        CHECK (amount_refunded + amount_refunding <= amount_captured),
    DROP COLUMN amount_disputed;
DROP INDEX payments_by_provider_charge;
DROP TABLE disputes;
