-- Our payments and refunds of these ids, with their status (for a provider movement we hold no
-- ledger movement for: is the operation unknown to us, or recorded in another state?).
SELECT id, account_id, status FROM payments WHERE id = ANY($1)
UNION ALL
SELECT id, account_id, status FROM refunds WHERE id = ANY($1)
