// Create an order and pay it, retried safely: ORDERPAY_URL, ORDERPAY_KEY and
// ORDERPAY_PAYMENT_METHOD (default pm_card_ok). Prints one JSON line:
// {"order_id", "payment_id", "status", "attempts", "replayed"} (the payment call's attempts).
//
//   npm run build && node examples/checkout.mjs

import { newKey, OrderpayClient } from "@orderpay/client";

const apiKey = process.env.ORDERPAY_KEY;
if (!apiKey) throw new Error("set ORDERPAY_KEY to the account's secret key");
const client = new OrderpayClient({ baseUrl: process.env.ORDERPAY_URL ?? "http://127.0.0.1:8080", apiKey });
// One intent, two keys (one per operation), kept by the client's key store.
const intent = await newKey();
const order = await client.createOrder({ currency: "USD", items: [{ sku: "tee", quantity: 2, unit_price: "19.99" }] }, { intent });
const payment_method = process.env.ORDERPAY_PAYMENT_METHOD ?? "pm_card_ok";
let line;
try {
  const paid = await client.payAndWait({ order_id: order.value.id, payment_method }, { intent });
  line = { order_id: order.value.id, payment_id: paid.value.id, status: paid.value.status, attempts: paid.attempts, replayed: paid.replayed };
} catch (error) {
  // A final refusal (a decline) names the payment it failed.
  line = { order_id: order.value.id, payment_id: error.problem?.payment_id ?? null, status: "failed", attempts: error.attempts, replayed: false, error: error.message };
}
console.log(JSON.stringify(line));
