-- Puts a relay's cursor ($1) back before the oldest event and stamps it with this cluster's
-- system identifier: the cursor was written in another cluster (a restore, a move).
UPDATE relay_cursors SET txid = '0', seq = 0, updated_at = now(),
    system_identifier = (SELECT system_identifier FROM pg_control_system())
WHERE relay = $1
