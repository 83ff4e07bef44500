-- A relay's cursor ($1), and whether it was written in this cluster (its system identifier).
SELECT txid::text, seq,
    coalesce(system_identifier = (SELECT system_identifier FROM pg_control_system()), false)
FROM relay_cursors WHERE relay = $1
