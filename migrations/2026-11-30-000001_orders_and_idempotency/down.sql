DROP TABLE idempotency_keys;
DROP TABLE order_items;
DROP TABLE orders;
DROP TABLE accounts;
