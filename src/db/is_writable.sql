-- Whether the server takes writes: not a standby, not read-only by setting.
SELECT NOT (pg_is_in_recovery() OR current_setting('transaction_read_only') = 'on')
