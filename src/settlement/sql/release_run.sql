-- A failed run gives its window back: a claim as old as time is stale to every instance.
UPDATE settlement_runs SET started_at = '-infinity' WHERE id = $1 AND finished_at IS NULL
