-- Our books follow the provider's money.

-- What is captured never exceeds what was authorized: the capture's amount comes from the
-- provider's answer, and this backs the guards that check it (a violation is a guard's bug).
ALTER TABLE payments ADD CONSTRAINT payments_captured_within_amount CHECK (amount_captured <= amount);
