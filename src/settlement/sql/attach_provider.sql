-- The provider's movement for an item that so far held only ours (`missing_provider`): the
-- comparison's category now, settled as matched later when the two agree.
UPDATE settlement_items SET category = $2, provider_id = $3, provider_category = $4,
    provider_amount = $5, provider_currency = $6, provider_source = $7, provider_key = $8,
    provider_created = $9,
    resolved_at = CASE WHEN $2 = 'matched' THEN $10 END,
    resolution = CASE WHEN $2 = 'matched' THEN 'matched_later' END
WHERE id = $1 AND provider_id IS NULL
