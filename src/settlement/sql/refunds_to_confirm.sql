-- The refunds behind this window's open `status_mismatch` items: the provider's movement says a
-- refund moved money (or was reversed) that we hold in another state. Each is looked up at the
-- provider before anything of ours changes (`settlement::confirm_refunds`).
SELECT DISTINCT account_id, object_id
FROM settlement_items
WHERE category = 'status_mismatch' AND resolved_at IS NULL AND ledger_movement_id IS NULL
    AND movement_class IN ('refund', 'refund_reversal')
    AND object_id IS NOT NULL AND account_id IS NOT NULL
    AND provider_created >= $1 AND provider_created < $2
