-- Movements that do not balance (a debit and a credit of the same account, or no amount): the
-- table's CHECKs refuse them, so any found here means those constraints were dropped.
SELECT count(*) FROM ledger_movements WHERE debit_account = credit_account OR amount <= 0
