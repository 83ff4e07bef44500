-- When the oldest event a relay ($1) has not handed on was written (NULL: none waits).
SELECT min(e.created_at) FROM events e, relay_cursors c
WHERE c.relay = $1 AND (e.txid, e.seq) > (c.txid, c.seq)
