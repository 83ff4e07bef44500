-- A page of an account's ledger movements made in [$4, $5) that no item holds yet, in id
-- order after $2 (ids are time-ordered: the bounds $2, $3 keep the scan to the window).
SELECT m.id, m.account_id, m.type, m.operation_id, m.payment_id, m.amount, m.currency, m.created_at
FROM ledger_movements AS m
WHERE m.account_id = $1 AND m.id > $2 AND m.id < $3
    AND m.created_at >= $4 AND m.created_at < $5
    AND NOT EXISTS (SELECT 1 FROM settlement_items AS i WHERE i.ledger_movement_id = m.id)
ORDER BY m.id
LIMIT $6
