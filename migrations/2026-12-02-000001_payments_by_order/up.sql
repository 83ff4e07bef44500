-- An order's payments, newest first: `GET /payments?order_id=` and the `payment_ids` of an order
-- as read (a client that lost a payment's id finds it through its order).
CREATE INDEX payments_by_order ON payments (account_id, order_id, id);
