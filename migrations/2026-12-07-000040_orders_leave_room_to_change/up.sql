-- An order changes after it is written (paid, refunded, cancelled), in no indexed column: its
-- only index is the primary key. Such an update is HOT (no new index entry, the new version on
-- the same page) when the page has room for the new version. Orders are inserted in time order
-- and filled to the brim, so the page of an order paid a few seconds after it was made is
-- already full, and each payment's update of its order wrote a new primary-key entry and a
-- version on another page. Leaving 15% of each page free gives the next versions room. Only
-- pages written from now on are filled to this mark.
ALTER TABLE orders SET (fillfactor = 85);
