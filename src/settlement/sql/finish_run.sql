UPDATE settlement_runs SET finished_at = $2, report = $3 WHERE id = $1
