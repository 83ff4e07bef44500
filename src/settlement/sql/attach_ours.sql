-- Our movement for an item that so far held only the provider's (`missing_ours`,
-- `status_mismatch`, `duplicate_provider`), compared as `compare` does (currency first, then the
-- signed amount) and settled as matched later when the two agree.
WITH compared AS (
    SELECT CASE WHEN upper(provider_currency) <> upper($6) THEN 'currency_mismatch'
                WHEN provider_amount <> $5 THEN 'amount_mismatch'
                ELSE 'matched' END AS category
    FROM settlement_items WHERE id = $1
)
UPDATE settlement_items SET category = compared.category, account_id = $2,
    ledger_movement_id = $3, ours_type = $4, ours_amount = $5, ours_currency = $6,
    ours_created = $7, ours_status = NULL,
    resolved_at = CASE WHEN compared.category = 'matched' THEN $8 END,
    resolution = CASE WHEN compared.category = 'matched' THEN 'matched_later' END
FROM compared
WHERE settlement_items.id = $1 AND settlement_items.ledger_movement_id IS NULL
