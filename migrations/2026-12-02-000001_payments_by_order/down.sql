DROP INDEX payments_by_order;
