-- The live (not revoked) key whose secret hashes to $1, with its account and the revocation
-- generation, read in one statement (one snapshot). Columns in `Found`'s order.
SELECT a.id, a.name, a.created_at, k.id, k.last_used_at, r.generation
FROM api_keys AS k JOIN accounts AS a ON a.id = k.account_id CROSS JOIN api_key_revocations AS r
WHERE k.key_hash = $1 AND k.revoked_at IS NULL
