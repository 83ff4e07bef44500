UPDATE webhook_endpoints SET enabled_events = ARRAY['*']::text[]
WHERE enabled_events && ARRAY['dispute.created', 'dispute.updated', 'dispute.funds_withdrawn',
    'dispute.funds_reinstated', 'dispute.closed']::text[];
ALTER TABLE webhook_endpoints DROP CONSTRAINT webhook_endpoints_enabled_events_check,
    ADD CONSTRAINT webhook_endpoints_enabled_events_check CHECK (
        cardinality(enabled_events) >= 1 AND enabled_events <@ ARRAY[
            '*', 'order.created', 'order.cancelled', 'order.paid', 'order.refunded',
            'order.partially_refunded', 'payment.succeeded', 'payment.failed',
            'payment.requires_capture', 'payment.canceled', 'payment.late_charge_refunded',
            'refund.succeeded', 'refund.failed']::text[]);
