-- Orders whose net money is wrong by the ledger: the net (what moved into the provider's
-- balance for the order, less what moved out) above the order's total, below zero, or not zero
-- when every payment of the order failed. Each comes with whether money is still in flight for
-- it (a late charge whose system refund is processing or watched, or whose follow-up is due):
-- then it is not a violation yet. $1 is now.
WITH net AS (
    SELECT account_id, order_id,
        coalesce(sum(amount) FILTER (WHERE debit_account = 'provider_balance'), 0)
        - coalesce(sum(amount) FILTER (WHERE credit_account = 'provider_balance'), 0) AS net
    FROM ledger_movements GROUP BY account_id, order_id
), judged AS (
    SELECT o.account_id, o.id, o.currency, o.total_amount, n.net,
        (SELECT bool_and(p.status = 'failed') FROM payments AS p
            WHERE p.account_id = o.account_id AND p.order_id = o.id) AS all_failed,
        EXISTS (
            SELECT FROM payments AS p
            WHERE p.account_id = o.account_id AND p.order_id = o.id
                AND p.late_charge_amount IS NOT NULL AND p.amount_refunded < p.amount_captured
                AND (p.next_check_at IS NOT NULL OR EXISTS (
                    SELECT FROM refunds AS r
                    WHERE r.account_id = p.account_id AND r.payment_id = p.id
                        AND r.idempotency_key IS NULL
                        AND (r.status = 'processing' OR r.late_watch_until > $1)))) AS in_flight
    FROM net AS n
    JOIN orders AS o ON o.account_id = n.account_id AND o.id = n.order_id
)
SELECT account_id, id, currency, total_amount, net, in_flight FROM judged
WHERE net > total_amount OR net < 0 OR (all_failed AND net <> 0)
ORDER BY account_id, id
