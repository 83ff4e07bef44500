-- A page's new items. A provider or ledger movement already in an item (another run got there
-- first) is skipped: each lands in exactly one.
INSERT INTO settlement_items (id, category, found_as, run_id, object_id, movement_class, rank,
    provider_id, provider_category, provider_amount, provider_currency, provider_source,
    provider_key, provider_created, account_id, ledger_movement_id, ours_type, ours_amount,
    ours_currency, ours_created, ours_status)
SELECT item.id, item.category, item.category, $1, item.object_id, item.movement_class,
    item.rank, item.provider_id, item.provider_category, item.provider_amount,
    item.provider_currency, item.provider_source, item.provider_key, item.provider_created,
    item.account_id, item.ledger_movement_id, item.ours_type, item.ours_amount,
    item.ours_currency, item.ours_created, item.ours_status
FROM unnest($2::uuid[], $3::text[], $4::uuid[], $5::text[], $6::int[], $7::text[], $8::text[],
    $9::numeric[], $10::text[], $11::text[], $12::text[], $13::timestamptz[], $14::uuid[],
    $15::uuid[], $16::text[], $17::numeric[], $18::text[], $19::timestamptz[], $20::text[])
    AS item (id, category, object_id, movement_class, rank, provider_id, provider_category,
        provider_amount, provider_currency, provider_source, provider_key, provider_created,
        account_id, ledger_movement_id, ours_type, ours_amount, ours_currency, ours_created,
        ours_status)
ON CONFLICT DO NOTHING
