-- Up to $3 events after the cursor ($1 transaction id as text, $2 sequence) in transaction order,
-- of transactions older than every one still running. Returns each event (the columns of
-- EventRow, in its order) with its place. The ORDER BY names the table's columns: a bare `txid`
-- there would be the text output column, and "1000" sorts before "999".
SELECT account_id, id, type, data, created_at, txid::text, seq FROM events
WHERE (txid, seq) > ($1::xid8, $2) AND txid < pg_snapshot_xmin(pg_current_snapshot())
ORDER BY events.txid, events.seq LIMIT $3
