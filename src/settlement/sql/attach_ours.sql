-- Our movement for an item that so far held only the provider's (`missing_ours`,
-- `status_mismatch`, `duplicate_provider`): the comparison's category now (`settlement::compare`),
-- settled as matched later when the two agree.
UPDATE settlement_items SET category = $2, account_id = $3, ledger_movement_id = $4,
    ours_type = $5, ours_amount = $6, ours_currency = $7, ours_created = $8, ours_status = NULL,
    resolved_at = CASE WHEN $2 = 'matched' THEN $9 END,
    resolution = CASE WHEN $2 = 'matched' THEN 'matched_later' END
WHERE id = $1 AND ledger_movement_id IS NULL
