-- Takes a relay for the caller's transaction (a transaction-scoped advisory lock named after the
-- relay, $1): true when taken, false when another instance holds it.
SELECT pg_try_advisory_xact_lock(hashtextextended('orderpay.relay.' || $1, 0))
