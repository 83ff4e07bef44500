-- For the transaction of one page. Items are derived data (a run again re-makes what a crash
-- lost), so a page's commit need not wait for its WAL to reach disk: a run writes a page per
-- commit, and waiting for each flush made a million movements take ten times as long. Plans
-- are made for each page's arrays: a plan cached while settlement_items was empty scans it.
SELECT set_config('synchronous_commit', 'off', true), set_config('plan_cache_mode', 'force_custom_plan', true)
