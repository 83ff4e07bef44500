-- Payments whose money columns and ledger disagree: what the ledger says each captured
-- (`charge_captured` and `late_charge` movements), refunded (refunds, their corrections and
-- late-charge refunds, less reversals) and disputed (withdrawals less reinstatements) against
-- `amount_captured`, `amount_refunded` and `amount_disputed`.
-- Returns the payment, then the column and the ledger's figure for each of the three.
WITH books AS (
    SELECT account_id, payment_id,
        coalesce(sum(amount) FILTER (WHERE type IN ('charge_captured', 'late_charge')), 0)
            AS captured,
        coalesce(sum(amount) FILTER (WHERE type IN ('refund', 'refund_correction',
            'late_charge_refund')), 0)
        - coalesce(sum(amount) FILTER (WHERE type = 'refund_reversal'), 0) AS refunded,
        coalesce(sum(amount) FILTER (WHERE type = 'dispute_withdrawal'), 0)
        - coalesce(sum(amount) FILTER (WHERE type = 'dispute_reinstatement'), 0) AS disputed
    FROM ledger_movements GROUP BY account_id, payment_id
)
SELECT p.account_id, p.id, p.currency, p.amount_captured, coalesce(b.captured, 0),
    p.amount_refunded, coalesce(b.refunded, 0), p.amount_disputed, coalesce(b.disputed, 0)
FROM payments AS p
LEFT JOIN books AS b ON b.account_id = p.account_id AND b.payment_id = p.id
WHERE p.amount_captured <> coalesce(b.captured, 0) OR p.amount_refunded <> coalesce(b.refunded, 0)
    OR p.amount_disputed <> coalesce(b.disputed, 0)
ORDER BY p.account_id, p.id
