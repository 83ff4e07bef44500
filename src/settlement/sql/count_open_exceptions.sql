SELECT category, count(*) FROM settlement_items
WHERE category <> 'matched' AND resolved_at IS NULL
GROUP BY category
