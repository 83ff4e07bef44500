UPDATE idempotency_keys AS k SET response_body = e.data, answer_event_id = NULL
FROM events AS e
WHERE e.account_id = k.account_id AND e.id = k.answer_event_id;
ALTER TABLE idempotency_keys DROP CONSTRAINT idempotency_keys_answer_once,
    DROP COLUMN answer_event_id;
