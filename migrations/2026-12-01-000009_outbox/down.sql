DROP TABLE relay_cursors;
DROP TABLE events;
