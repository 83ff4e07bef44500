DROP TABLE idempotency_key_audit;
DROP TABLE api_key_revocations;
-- Back to one key per account: the oldest live one. An account whose keys are all revoked gets
-- a hash nobody holds the secret of, so that going down never brings a revoked key back.
ALTER TABLE accounts ADD COLUMN api_key_hash bytea;
UPDATE accounts AS a SET api_key_hash = coalesce(
    (SELECT k.key_hash FROM api_keys AS k
     WHERE k.account_id = a.id AND k.revoked_at IS NULL ORDER BY k.created_at, k.id LIMIT 1),
    sha256(convert_to(gen_random_uuid()::text, 'UTF8')));
ALTER TABLE accounts
    ALTER COLUMN api_key_hash SET NOT NULL,
    ADD CONSTRAINT accounts_api_key_hash_key UNIQUE (api_key_hash),
    ADD CONSTRAINT accounts_api_key_hash_check CHECK (length(api_key_hash) = 32);
DROP TABLE api_keys;
