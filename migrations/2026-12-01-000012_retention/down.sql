DROP INDEX provider_webhooks_by_age;
DROP INDEX webhook_deliveries_by_age;
