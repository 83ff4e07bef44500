-- What the window's items say: the provider's movements made in it, and ours made in it that
-- the provider did not report; per category and currency on each side.
SELECT category, provider_currency, ours_currency, count(*),
    coalesce(sum(provider_amount), 0), coalesce(sum(ours_amount), 0),
    count(provider_id), count(ledger_movement_id), count(*) FILTER (WHERE resolved_at IS NULL)
FROM settlement_items
WHERE (provider_created >= $1 AND provider_created < $2)
    OR (provider_id IS NULL AND ours_created >= $1 AND ours_created < $2)
GROUP BY category, provider_currency, ours_currency
