-- For the transaction of one page. Items are derived data (a run again re-makes what a crash
-- lost), so a page's commit need not wait for its WAL to reach disk. Plans are made for each
-- page's arrays (a plan cached while settlement_items was empty scans it), without JIT (whose
-- compilation, set off by the estimates of a table not yet analyzed, cost more than the query).
SELECT set_config('synchronous_commit', 'off', true), set_config('plan_cache_mode', 'force_custom_plan', true),
    set_config('jit', 'off', true)
