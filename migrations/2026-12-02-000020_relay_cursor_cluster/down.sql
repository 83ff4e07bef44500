ALTER TABLE relay_cursors DROP COLUMN system_identifier;
