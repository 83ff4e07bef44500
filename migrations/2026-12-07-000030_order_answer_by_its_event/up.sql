-- A new order's stored answer is the data of its `order.created` event, byte for byte: both
-- are the order as created, and neither ever changes. The key row names that event instead of
-- holding a second copy of the answer (about 500 bytes of heap and WAL per keyed order); a
-- replay that misses the service's memory reads the body from the event. The service refuses
-- to start with events kept for less time than keys (src/config/mod.rs), so the event outlives
-- every key that names it.
ALTER TABLE idempotency_keys ADD COLUMN answer_event_id uuid,
    ADD CONSTRAINT idempotency_keys_answer_once
        CHECK (answer_event_id IS NULL OR response_body IS NULL);
