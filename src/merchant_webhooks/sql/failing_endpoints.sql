-- The live endpoints with failing deliveries (pending ones whose last attempt failed, and ones
-- given up on that no later delivery of the same event to the endpoint made up for), longest
-- failing first. Columns in `FailingEndpoint`'s order.
WITH failing AS (
    SELECT d.* FROM webhook_deliveries AS d
    WHERE d.failing_since IS NOT NULL AND (d.status = 'pending' OR (
        d.status = 'failed' AND NOT EXISTS (
            SELECT FROM webhook_deliveries AS later
            WHERE later.account_id = d.account_id AND later.endpoint_id = d.endpoint_id
                AND later.event_id = d.event_id AND later.status = 'delivered'))))
SELECT e.id, e.account_id, e.url, count(*),
    count(*) FILTER (WHERE f.status = 'failed'),
    min(f.failing_since) AS failing_since,
    (array_agg(f.last_error ORDER BY f.last_attempt_at DESC NULLS LAST))[1],
    (array_agg(f.last_status ORDER BY f.last_attempt_at DESC NULLS LAST))[1],
    min(f.next_attempt_at) FILTER (WHERE f.status = 'pending')
FROM failing AS f
JOIN webhook_endpoints AS e ON e.account_id = f.account_id AND e.id = f.endpoint_id
    AND e.deleted_at IS NULL
GROUP BY e.account_id, e.id, e.url
ORDER BY failing_since, e.id
