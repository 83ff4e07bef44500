DROP INDEX refunds_by_id;
DROP INDEX payments_by_id;
DROP TABLE provider_webhooks;
