-- The provider movements some run already put in an item.
SELECT provider_id FROM settlement_items WHERE provider_id = ANY($1)
