-- Every ledger movement of these payments and refunds (whatever their time): a payment's
-- charges are its own operations, a refund's movements the refund's; a payment's dispute
-- movements hang off the dispute, found through the payment.
SELECT m.id, m.account_id, m.type, m.operation_id, m.payment_id, m.amount, m.currency, m.created_at
FROM ledger_movements AS m
WHERE m.operation_id = ANY($1)
UNION ALL
SELECT m.id, m.account_id, m.type, m.operation_id, m.payment_id, m.amount, m.currency, m.created_at
FROM payments AS p
JOIN ledger_movements AS m ON m.account_id = p.account_id AND m.payment_id = p.id
WHERE p.id = ANY($1) AND m.type IN ('dispute_withdrawal', 'dispute_reinstatement')
