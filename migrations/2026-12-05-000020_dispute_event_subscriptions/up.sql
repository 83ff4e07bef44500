-- A webhook endpoint may subscribe to the dispute events: the events table took them with the
-- disputes, the endpoints' list of types did not (subscribing answered 500).
ALTER TABLE webhook_endpoints DROP CONSTRAINT webhook_endpoints_enabled_events_check,
    ADD CONSTRAINT webhook_endpoints_enabled_events_check CHECK (
        cardinality(enabled_events) >= 1 AND enabled_events <@ ARRAY[
            '*', 'order.created', 'order.cancelled', 'order.paid', 'order.refunded',
            'order.partially_refunded', 'payment.succeeded', 'payment.failed',
            'payment.requires_capture', 'payment.canceled', 'payment.late_charge_refunded',
            'refund.succeeded', 'refund.failed', 'dispute.created', 'dispute.updated',
            'dispute.funds_withdrawn', 'dispute.funds_reinstated', 'dispute.closed']::text[]);
