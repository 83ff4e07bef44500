-- A run of the window [$2, $3): an operator's always starts; the job's only when no instance
-- ran the window yet, or one claimed it and died before finishing (its claim older than $6).
INSERT INTO settlement_runs AS run (id, window_start, window_end, scheduled, started_at)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (window_start, window_end) WHERE scheduled
DO UPDATE SET started_at = excluded.started_at
    WHERE run.finished_at IS NULL AND run.started_at < $6
RETURNING run.id
