-- The items already made for these payments and refunds: an index lookup per object (a LATERAL
-- subquery kept apart by OFFSET 0, which the planner cannot turn into a join that scans every
-- item), whatever it believes of a table that grew by a million rows since it was analyzed.
SELECT i.id, i.object_id, i.movement_class, i.rank, i.provider_id IS NOT NULL, i.ledger_movement_id,
    i.provider_amount, i.provider_currency
FROM unnest($1::uuid[]) AS o (object_id)
CROSS JOIN LATERAL (
    SELECT * FROM settlement_items AS i WHERE i.object_id = o.object_id OFFSET 0
) AS i
