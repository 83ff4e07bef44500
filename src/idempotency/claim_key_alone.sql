-- The claim alone (claim_key.sql precedes this): 1 when this statement claimed the key.
SELECT count(*) FROM claimed
