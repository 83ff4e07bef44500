-- Orders whose money is wrong by the ledger. Per order, three figures:
--   net: what the ledger says the provider holds for the order's payments, which must equal
--     what their columns say (captured, less refunded, less disputed: withdrawn less
--     reinstated);
--   kept: what the provider holds for the order's payments (into its balance, less out of it),
--     late charges apart: never above the order's total, never below zero, and zero when
--     every payment of the order failed;
--   late charges unrefunded: charges that landed on failed payments and are not given back yet
--     (the `late_charges` account's balance for the order): zero, unless money is still in
--     flight for them (a system refund processing or watched, or the payment's follow-up due).
-- Returns each order where one of them is off, with whether that is only money in flight.
-- $1 is now.
WITH sums AS (
    SELECT account_id, order_id,
        coalesce(sum(amount) FILTER (WHERE debit_account = 'provider_balance'), 0)
        - coalesce(sum(amount) FILTER (WHERE credit_account = 'provider_balance'), 0) AS net,
        coalesce(sum(amount) FILTER (WHERE credit_account = 'late_charges'), 0)
        - coalesce(sum(amount) FILTER (WHERE debit_account = 'late_charges'), 0) AS late
    FROM ledger_movements GROUP BY account_id, order_id
), columns AS (
    SELECT account_id, order_id,
        sum(amount_captured - amount_refunded - amount_disputed) AS taken
    FROM payments GROUP BY account_id, order_id
), judged AS (
    SELECT o.account_id, o.id, o.currency, o.total_amount, s.net - s.late AS kept, s.late,
        s.net, coalesce(c.taken, 0) AS taken,
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
                        AND (r.status = 'processing' OR r.late_watch_until > $1
                            -- still watched past its end: the provider has not answered
                            OR (r.status = 'failed' AND r.next_check_at IS NOT NULL))))) AS late_in_flight
    FROM sums AS s
    JOIN orders AS o ON o.account_id = s.account_id AND o.id = s.order_id
    LEFT JOIN columns AS c ON c.account_id = s.account_id AND c.order_id = s.order_id
)
SELECT account_id, id, currency, total_amount, kept, late, net, taken,
    kept > total_amount OR kept < 0 OR (all_failed AND kept <> 0)
        OR (late <> 0 AND NOT late_in_flight) OR net <> taken AS violation
FROM judged
WHERE kept > total_amount OR kept < 0 OR (all_failed AND kept <> 0) OR late <> 0 OR net <> taken
ORDER BY account_id, id
