-- Where an operation stands, as a retry of the key that started it needs to know: its final
-- answer once it has one (its body on the row, or the data of the event the row names: see
-- the migration operation_answer_by_its_event), and the lease of whoever drives it (with its
-- owner and the operation's status, for `orderpay keys show`).
-- Parameters: 1 account, 2 operation id.
SELECT answer_status,
    coalesce(answer_body,
        (SELECT data FROM events WHERE events.account_id = $1 AND events.id = operation_table.answer_event_id)),
    lease_until, lease_id, status, status = 'processing'
FROM operation_table WHERE account_id = $1 AND id = $2
