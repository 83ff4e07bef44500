-- The items already made for these payments and refunds.
SELECT id, object_id, movement_class, rank, provider_id IS NOT NULL, ledger_movement_id
FROM settlement_items
WHERE object_id = ANY($1)
