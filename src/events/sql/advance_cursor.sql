-- Moves a relay's cursor ($1, locked by the caller's transaction) to $2 (transaction id as text)
-- and $3 (sequence).
UPDATE relay_cursors SET txid = $2::xid8, seq = $3, updated_at = now() WHERE relay = $1
