DROP TABLE settlement_items;
DROP TABLE settlement_runs;
