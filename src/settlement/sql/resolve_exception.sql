-- An operator acknowledges an open exception, with a note.
UPDATE settlement_items SET resolved_at = $2, resolution = 'acknowledged', note = $3
WHERE id = $1 AND category <> 'matched' AND resolved_at IS NULL
RETURNING id
