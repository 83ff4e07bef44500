-- Deletes up to $2 of the oldest events created before $1. The scan is bounded by the batch (the
-- oldest events in commit order, then those of them past the retention); only those are locked.
DELETE FROM events WHERE (txid, seq) IN (
    SELECT txid, seq FROM events
    WHERE (txid, seq) IN (SELECT txid, seq FROM events ORDER BY txid, seq LIMIT $2)
        AND created_at < $1
    FOR UPDATE SKIP LOCKED)
