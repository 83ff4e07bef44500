-- The exceptions nobody settled yet, oldest first, with both sides.
SELECT id, category, found_as, run_id, object_id, movement_class, provider_id, provider_category,
    provider_amount, provider_currency, provider_source, provider_key, provider_created,
    account_id, ledger_movement_id, ours_type, ours_amount, ours_currency, ours_created,
    ours_status
FROM settlement_items
WHERE category <> 'matched' AND resolved_at IS NULL
ORDER BY coalesce(provider_created, ours_created), id
LIMIT $1
