// The TypeScript client against a real orderpay and mock provider (run through
// tests/scripts/with-service.sh: `make clients-test`), and through the fault proxy.

import assert from "node:assert/strict";
import { createServer } from "node:http";
import { test } from "node:test";
import { MemoryKeyStore, OrderpayClient, OrderpayError, verifyWebhook } from "../dist/index.js";
import { faultRun } from "./fault-run.mjs";
import { charges, count, order, service, startProxy } from "./support.mjs";

assert.ok(service.url && service.key && service.mock && service.database, "run through tests/scripts/with-service.sh");

const client = (options = {}) => new OrderpayClient({ baseUrl: service.url, apiKey: service.key, ...options });
const intent = (name) => `${name}-${Date.now()}-${Math.random().toString(36).slice(2)}`;
const ordersOf = (id) => count(`SELECT count(*) FROM orders WHERE metadata->>'intent' = '${id}'`);
const chargesOf = async (paymentId) => (await charges()).filter((charge) => charge.reference === paymentId).length;

test("an intent keeps one key per operation, and a resumed call replays", async () => {
  const store = new MemoryKeyStore();
  const orderpay = client({ keyStore: store });
  const id = intent("keys");
  const created = await orderpay.createOrder(order(id), { intent: id });
  assert.deepEqual([created.status, created.replayed, created.attempts], [201, false, 1]);
  assert.equal(created.value.total_amount, "39.98", "money is the exact decimal string");
  assert.deepEqual(created.value.payment_ids, []);
  const paid = await orderpay.createPayment({ order_id: created.value.id, payment_method: "pm_card_ok" }, { intent: id });
  assert.equal(paid.value.status, "succeeded");
  const orderKey = await store.load(id, "createOrder");
  const payKey = await store.load(id, "createPayment");
  assert.notEqual(orderKey.key, payKey.key, "a key is bound to its route: two keys for one intent");
  assert.equal(created.key, orderKey.key);
  assert.ok(orderKey.firstSentAtMs > 0);
  const again = await orderpay.createOrder(order(id), { intent: id });
  assert.ok(again.replayed);
  assert.equal(again.value.id, created.value.id);
  const paidAgain = await orderpay.createPayment({ order_id: created.value.id, payment_method: "pm_card_ok" }, { intent: id });
  assert.ok(paidAgain.replayed);
  assert.equal(ordersOf(id), 1);
  assert.equal(await chargesOf(paid.value.id), 1);
});

test("a changed body on a retried key is the key-reused error and is never retried", async () => {
  let sends = 0;
  const orderpay = client({ maxRetries: 10, onRequest: () => sends++ });
  const id = intent("reused");
  await orderpay.createOrder(order(id), { intent: id });
  const changed = order(id);
  changed.items[0].quantity = 3;
  await assert.rejects(orderpay.createOrder(changed, { intent: id }), (error) => {
    assert.ok(error instanceof OrderpayError);
    assert.equal(error.kind, "key_reused");
    assert.equal(error.attempts, 1, "never retried");
    assert.equal(error.status, 422);
    assert.ok(error.key);
    return true;
  });
  assert.equal(sends, 2);
  assert.equal(ordersOf(id), 1);
});

test("two concurrent sends of one intent converge on one result", async () => {
  await fetch(`${service.mock}/_admin/faults`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ latency_ms: 800 }) });
  try {
    const store = new MemoryKeyStore();
    const [one, two] = [client({ keyStore: store }), client({ keyStore: store })];
    const id = intent("concurrent");
    const created = await one.createOrder(order(id), { intent: id });
    const pay = { order_id: created.value.id, payment_method: "pm_card_ok" };
    const [first, second] = await Promise.all([one.payAndWait(pay, { intent: id }), two.payAndWait(pay, { intent: id })]);
    assert.deepEqual(first.value, second.value, "one result");
    assert.equal(first.key, second.key, "one key");
    assert.equal(first.value.status, "succeeded");
    assert.notEqual(first.replayed, second.replayed, "one ran, the other replayed it");
    assert.ok((first.replayed ? first : second).attempts >= 2, "the other waited for it");
    assert.equal(await chargesOf(first.value.id), 1);
  } finally {
    await fetch(`${service.mock}/_admin/faults`, { method: "POST", headers: { "content-type": "application/json" }, body: "{}" });
  }
});

test("payAndWait re-sends a 202 until the final answer; refunds and captures the same", async () => {
  const orderpay = client();
  const id = intent("wait");
  const created = await orderpay.createOrder(order(id));
  const pay = { order_id: created.value.id, payment_method: "pm_provider_pending" };
  const pending = await orderpay.createPayment(pay, { intent: id });
  assert.ok(pending.processing);
  assert.equal(pending.value.status, "processing");
  const paid = await orderpay.payAndWait(pay, { intent: id });
  assert.deepEqual([paid.status, paid.value.status, paid.value.id], [201, "succeeded", pending.value.id]);
  const refund = await orderpay.refundAndWait({ payment_id: paid.value.id, amount: "10.00" });
  assert.deepEqual([refund.status, refund.value.status], [201, "succeeded"]);
  const second = await orderpay.createOrder(order(intent("manual")));
  const authorized = await orderpay.payAndWait({ order_id: second.value.id, payment_method: "pm_card_ok", capture_method: "manual" });
  assert.equal(authorized.value.status, "requires_capture");
  const captured = await orderpay.captureAndWait(authorized.value.id);
  assert.equal(captured.value.status, "succeeded");
});

test("a final answer stops at once, with the key and the problem", async () => {
  const orderpay = client({ maxRetries: 10 });
  const created = await orderpay.createOrder(order(intent("final")));
  const key = intent("decline");
  for (const replay of [false, true]) {
    await assert.rejects(orderpay.createPayment({ order_id: created.value.id, payment_method: "pm_card_declined" }, { key }), (error) => {
      assert.deepEqual([error.kind, error.status, error.attempts, error.key], ["api", 402, 1, key], String(replay));
      assert.equal(error.problem.type, "payment-declined");
      assert.equal(error.resumable, false);
      return true;
    });
  }
  await assert.rejects(orderpay.createPayment({ order_id: created.value.id, payment_method: "pm_card_ok" }, { key: "bad key" }), { kind: "invalid" });
  await assert.rejects(orderpay.getOrder("0199e3a2-0000-7000-8000-000000000000"), { kind: "api", status: 404, attempts: 1 });
});

test("an app finds its way back through the order and the lists", async () => {
  const orderpay = client();
  const created = await orderpay.createOrder(order(intent("lists")));
  const paid = (await orderpay.payAndWait({ order_id: created.value.id, payment_method: "pm_card_ok" })).value;
  const refunded = (await orderpay.refundAndWait({ payment_id: paid.id, reason: "duplicate" })).value;
  assert.deepEqual((await orderpay.getOrder(created.value.id)).value.payment_ids, [paid.id]);
  const payments = (await orderpay.listPayments({ order_id: created.value.id })).value;
  assert.deepEqual(payments.data, [(await orderpay.getPayment(paid.id)).value]);
  assert.equal((await orderpay.listPayments({ status: "succeeded", limit: 1 })).value.data.length, 1);
  assert.deepEqual((await orderpay.listRefunds({ payment_id: paid.id })).value.data, [refunded]);
  assert.deepEqual((await orderpay.getRefund(refunded.id)).value, refunded);
  assert.equal((await orderpay.listOrders({ limit: 1 })).value.data[0].status, "refunded");
  const event = (await orderpay.listEvents({ type: "order.refunded", limit: 1 })).value.data[0];
  assert.deepEqual((await orderpay.getEvent(event.id)).value, event);
  assert.equal(event.data.object.id, created.value.id);
  const cancelled = await orderpay.createOrder(order(intent("cancel")));
  assert.equal((await orderpay.cancelOrder(cancelled.value.id)).value.status, "cancelled");
  const manual = await orderpay.createOrder(order(intent("void")));
  const authorized = (await orderpay.payAndWait({ order_id: manual.value.id, payment_method: "pm_card_ok", capture_method: "manual" })).value;
  assert.equal((await orderpay.voidPayment(authorized.id)).value.status, "canceled");
});

test("merchant webhooks verify and parse with the client, across a rotation", async () => {
  const received = [];
  const receiver = createServer((request, response) => {
    const chunks = [];
    request.on("data", (chunk) => chunks.push(chunk));
    request.on("end", () => {
      received.push({ headers: request.headers, body: Buffer.concat(chunks) });
      response.end("ok");
    });
  });
  await new Promise((resolve) => receiver.listen(0, "127.0.0.1", resolve));
  const orderpay = client();
  try {
    const url = `http://127.0.0.1:${receiver.address().port}/hooks`;
    const endpoint = (await orderpay.createWebhookEndpoint({ url, enabled_events: ["order.created"] })).value;
    const oldSecret = endpoint.secret;
    assert.match(oldSecret, /^whsec_/);
    assert.equal((await orderpay.getWebhookEndpoint(endpoint.id)).value.id, endpoint.id);
    assert.ok((await orderpay.listWebhookEndpoints()).value.data.some((listed) => listed.id === endpoint.id));
    const waitFor = async (count) => {
      for (let waited = 0; received.length < count; waited += 20) {
        assert.ok(waited < 10_000, "a delivery within 10 s");
        await new Promise((resolve) => setTimeout(resolve, 20));
      }
      return received[count - 1];
    };
    const created = await orderpay.createOrder(order(intent("hook")));
    const delivery = await waitFor(1);
    const event = await verifyWebhook({ secrets: [oldSecret], headers: delivery.headers, body: delivery.body });
    assert.equal(event.type, "order.created");
    assert.equal(event.data.object.id, created.value.id);
    const tampered = Buffer.from(delivery.body);
    tampered[10] ^= 1;
    await assert.rejects(verifyWebhook({ secrets: [oldSecret], headers: delivery.headers, body: tampered }), /no signature/);

    const newSecret = (await orderpay.rotateWebhookEndpointSecret(endpoint.id)).value.secret;
    await orderpay.createOrder(order(intent("hook")));
    const rotated = await waitFor(2);
    for (const secrets of [[oldSecret], [newSecret], [newSecret, oldSecret]]) {
      await verifyWebhook({ secrets, headers: rotated.headers, body: rotated.body });
    }
    assert.ok((await orderpay.deleteWebhookEndpoint(endpoint.id)).value.deleted);
  } finally {
    receiver.close();
  }
});

test("200 intents through 20% faults end with one order and one charge each", async () => {
  const result = await faultRun({ mode: "retries", intents: Number(process.env.CLIENT_FAULT_INTENTS ?? 200) });
  console.log(result.line);
  assert.ok(result.faulted > 0);
  assert.equal(result.mostDuplicated, 0, "never two orders for one intent");
  assert.deepEqual([result.orders, result.duplicated], [result.intents, 0], "exactly one order per intent");
  assert.deepEqual([result.paid, result.paidOrders], [result.intents, result.intents], "every order paid once");
  assert.equal(result.charged, result.intents, "one charge per order");
});

test("the proxy holds an answer until it is released", async () => {
  const proxy = await startProxy({ hold: "/orders" });
  try {
    const orderpay = new OrderpayClient({ baseUrl: proxy.url, apiKey: service.key });
    let settled = false;
    const pending = orderpay.createOrder(order(intent("held"))).then((reply) => ((settled = true), reply));
    for (let waited = 0; (await proxy.stats()).held === 0; waited += 20) {
      assert.ok(waited < 5000);
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    assert.equal(settled, false);
    await proxy.release();
    assert.equal((await pending).status, 201);
  } finally {
    proxy.stop();
  }
});
