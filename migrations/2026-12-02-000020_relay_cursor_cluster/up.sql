-- A relay's cursor is a place in the order of one cluster's transaction ids. A logical dump
-- restored into another cluster keeps the events' txid values, but the new cluster numbers its
-- transactions afresh: new events could sort before the cursor and never be handed on. So the
-- cursor keeps the identifier of the cluster it was written in; a relay that finds another one
-- starts over from the oldest event (events::repository::lock_cursor). NULL: not known, which
-- counts as another cluster.
ALTER TABLE relay_cursors ADD COLUMN system_identifier bigint;
UPDATE relay_cursors SET system_identifier = (SELECT system_identifier FROM pg_control_system());
