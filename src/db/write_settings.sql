-- The server settings that decide what a write costs in WAL and flushes (bench/postgresql.conf
-- explains each), with their values in their own units. Columns in `WriteSettings`' order.
SELECT name, setting, coalesce(unit, ''), current_setting(name)
FROM pg_settings
WHERE name IN ('wal_compression', 'max_wal_size', 'checkpoint_timeout', 'wal_buffers', 'shared_buffers')
ORDER BY name
