-- What moves a key row to the audit, after a `doomed` CTE naming the `account_id, key` of the
-- rows to delete: their metadata, without the stored answer. Returns how many keys it moved. A
-- conflict cannot happen (a key is claimed again only after its row is gone, and `created_at`
-- differs), but should one ever, the key is still freed rather than the sweeper stuck on it.
moved AS (
    DELETE FROM idempotency_keys AS k USING doomed AS d
    WHERE k.account_id = d.account_id AND k.key = d.key
    RETURNING k.account_id, k.key, k.method, k.route, k.fingerprint, k.resource_kind,
        k.resource_id, k.response_status, k.created_at, k.expires_at
), audited AS (
    INSERT INTO idempotency_key_audit (account_id, key, method, route, fingerprint,
        resource_kind, resource_id, response_status, created_at, expires_at)
    SELECT * FROM moved ON CONFLICT DO NOTHING
)
SELECT count(*) FROM moved
