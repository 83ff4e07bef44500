-- What the outbox leaves behind is kept as long as the events: finished webhook deliveries (and
-- their attempts) and received provider webhooks are deleted by the events sweeper past
-- ORDERPAY_EVENT_RETENTION_DAYS. Both tables grow in time order, so a BRIN index on the time
-- finds the old rows for a few pages of index and costs the writers nothing per row (its
-- ranges are summarized by vacuum, not by the inserts).
CREATE INDEX webhook_deliveries_by_age ON webhook_deliveries USING brin (created_at);
CREATE INDEX provider_webhooks_by_age ON provider_webhooks USING brin (received_at);
