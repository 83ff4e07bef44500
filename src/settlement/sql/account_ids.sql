SELECT id FROM accounts ORDER BY id
