// The retry rules of clients/retry-rules.json (shared with the Rust client), the operations of
// openapi.yaml, the version, keys, and webhook signatures: no service needed.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";
import { parse } from "yaml";
import {
  backoff,
  COVERED,
  decide,
  DEFAULT_SETTINGS,
  EXCLUDED,
  expired,
  MemoryKeyStore,
  newKey,
  OrderpayClient,
  OrderpayError,
  signWebhook,
  validKey,
  verifyWebhook,
} from "../dist/index.js";

const repository = new URL("../../../", import.meta.url);
const rules = JSON.parse(readFileSync(new URL("clients/retry-rules.json", repository), "utf8"));
const spec = parse(readFileSync(new URL("openapi.yaml", repository), "utf8"));

test("the defaults are the published ones", () => {
  const defaults = rules.defaults;
  assert.deepEqual(DEFAULT_SETTINGS, {
    maxRetries: defaults.max_retries,
    backoffBaseMs: defaults.backoff_base_ms,
    backoffCapMs: defaults.backoff_cap_ms,
    backoffFloorMs: defaults.backoff_floor_ms,
    timeoutMs: defaults.timeout_ms,
    deadlineMs: defaults.deadline_ms,
    keyTtlMs: defaults.key_ttl_ms,
  });
});

test("backoff doubles from half a second to five, with jitter and a floor", () => {
  assert.ok(rules.backoff.length > 0);
  for (const vector of rules.backoff) {
    assert.equal(backoff(DEFAULT_SETTINGS, vector.retry, vector.random), vector.delay_ms, JSON.stringify(vector));
  }
});

function outcome(value) {
  if (value.transport) return { transport: value.transport };
  return {
    status: value.status,
    type: value.type,
    retryAfterMs: value.retry_after === undefined ? undefined : value.retry_after * 1000,
    shouldRetry: value.should_retry === undefined ? undefined : value.should_retry === "true",
  };
}

test("every decision of the shared table", () => {
  assert.ok(rules.decisions.length > 40);
  for (const vector of rules.decisions) {
    const settings = { ...DEFAULT_SETTINGS, ...(vector.settings?.max_retries !== undefined && { maxRetries: vector.settings.max_retries }) };
    const decision = decide(settings, vector.attempt, outcome(vector.outcome), vector.waiting ?? false, vector.remaining_ms ?? 60_000, vector.random ?? 0);
    const expected =
      vector.expect === "done"
        ? { action: "done" }
        : vector.expect === "retry"
          ? { action: "retry", delayMs: vector.delay_ms }
          : { action: "stop", error: vector.error };
    assert.deepEqual(decision, expected, vector.name);
  }
});

test("keys the service accepts, new keys, and their lifetime", async () => {
  for (const key of rules.keys.valid) assert.ok(validKey(key), key);
  for (const key of rules.keys.invalid) assert.ok(!validKey(key), key);
  const longest = rules.keys.longest_valid_length;
  assert.ok(validKey("k".repeat(longest)) && !validKey("k".repeat(longest + 1)));
  const key = await newKey();
  assert.match(key, /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
  assert.notEqual(key, await newKey());
  const now = 10_000_000_000;
  for (const vector of rules.key_ttl) {
    const stored = { key: "k", ...(vector.first_sent_ago_ms !== null && { firstSentAtMs: now - vector.first_sent_ago_ms }) };
    assert.equal(expired(stored, DEFAULT_SETTINGS.keyTtlMs, now), vector.expired, JSON.stringify(vector));
  }
});

test("an intent's key older than keyTtlMs is refused before anything is sent", async () => {
  const store = new MemoryKeyStore();
  await store.save("old", "createOrder", { key: "old-key", firstSentAtMs: Date.now() - DEFAULT_SETTINGS.keyTtlMs - 1 });
  let sent = 0;
  const client = new OrderpayClient({ baseUrl: "http://127.0.0.1:9", apiKey: "sk_x", keyStore: store, fetch: async () => (sent++, new Response("{}")) });
  await assert.rejects(client.createOrder({ currency: "USD", items: [] }, { intent: "old" }), (error) => {
    assert.ok(error instanceof OrderpayError);
    assert.equal(error.kind, "key_expired");
    assert.equal(error.key, "old-key");
    return true;
  });
  assert.equal(sent, 0);
});

test("every operation of openapi.yaml is covered or excluded by name, at its route", () => {
  const published = new Map();
  for (const [path, item] of Object.entries(spec.paths)) {
    for (const [method, operation] of Object.entries(item)) published.set(operation.operationId, [method.toUpperCase(), path]);
  }
  assert.ok(published.size > 20);
  const covered = new Set(COVERED.map(([id]) => id));
  const missing = [...published.keys()].filter((id) => !covered.has(id) && !EXCLUDED.includes(id));
  assert.deepEqual(missing, [], "openapi.yaml has operations the client lacks");
  const stale = [...covered, ...EXCLUDED].filter((id) => !published.has(id));
  assert.deepEqual(stale, [], "the client lists operations openapi.yaml does not have");
  for (const [id, method, path] of COVERED) assert.deepEqual(published.get(id), [method, path], id);
});

test("the version is the API's", () => {
  const pkg = JSON.parse(readFileSync(new URL("../package.json", import.meta.url), "utf8"));
  assert.equal(pkg.version, spec.info.version);
});

test("webhook signatures follow the Standard Webhooks reference", async () => {
  const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
  const [id, timestamp, body] = ["msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, '{"test": 2432232314}'];
  const expected = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";
  assert.equal(await signWebhook(secret, id, timestamp, body), expected);
  const headers = (signature) => ({ "webhook-id": id, "webhook-timestamp": String(timestamp), "webhook-signature": signature });
  assert.deepEqual(await verifyWebhook({ secrets: [secret], headers: headers(expected), body, nowSec: timestamp }), { test: 2432232314 });
  await verifyWebhook({ secrets: [secret], headers: headers(`v1,bm9wZQ== ${expected}`), body, nowSec: timestamp });
  await assert.rejects(verifyWebhook({ secrets: [secret], headers: headers(expected), body: '{"test": 2432232315}', nowSec: timestamp }), /no signature/);
  await assert.rejects(verifyWebhook({ secrets: [secret], headers: headers(expected), body, nowSec: timestamp + 301 }), /tolerance/);
  const other = "whsec_c2VjcmV0LW9mLWFub3RoZXItZW5kcG9pbnQtMzJieXRlcw==";
  await assert.rejects(verifyWebhook({ secrets: [other], headers: headers(expected), body, nowSec: timestamp }), /no signature/);
  await assert.rejects(verifyWebhook({ secrets: ["whsec_***"], headers: headers(expected), body, nowSec: timestamp }), /whsec_/);
});

test("two sends of one intent racing each other share the key that was saved first", async () => {
  const keys = [];
  const fetch = async (_url, init) => {
    keys.push(init.headers["idempotency-key"]);
    return new Response("{}", { status: 201 });
  };
  const client = new OrderpayClient({ baseUrl: "http://127.0.0.1:9", apiKey: "sk_x", fetch });
  const order = { currency: "USD", items: [{ sku: "tee", quantity: 1, unit_price: "1.00" }] };
  const [one, two] = await Promise.all([client.createOrder(order, { intent: "i" }), client.createOrder(order, { intent: "i" })]);
  assert.equal(one.key, two.key);
  assert.deepEqual(keys, [one.key, one.key]);
  const store = new MemoryKeyStore();
  await store.save("i", "createOrder", { key: "first" });
  await store.save("i", "createOrder", { key: "second", firstSentAtMs: 1 });
  await store.save("i", "createOrder", { key: "first", firstSentAtMs: 7 });
  assert.deepEqual(await store.load("i", "createOrder"), { key: "first", firstSentAtMs: 7 });
  assert.equal(await store.load("i", "createPayment"), undefined);
});
