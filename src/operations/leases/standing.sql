-- Where an operation stands, as a retry of the key that started it needs to know: its final
-- answer once it has one, and the lease of whoever drives it (with its owner and the
-- operation's status, for `orderpay keys show`).
-- Parameters: 1 account, 2 operation id.
SELECT answer_status, answer_body, lease_until, lease_id, status, status = 'processing' FROM operation_table WHERE account_id = $1 AND id = $2
