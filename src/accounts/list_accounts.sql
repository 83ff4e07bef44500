-- Every account, oldest first, with its number of live keys. Columns in `AccountSummary`'s order.
SELECT a.id, a.name, a.created_at,
    (SELECT count(*) FROM api_keys AS k WHERE k.account_id = a.id AND k.revoked_at IS NULL)
FROM accounts AS a ORDER BY a.created_at, a.id
