ALTER TABLE order_items ADD FOREIGN KEY (account_id, order_id) REFERENCES orders (account_id, id) ON DELETE CASCADE;
