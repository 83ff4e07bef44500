// A merchant's checkout backend: it serves the checkout page and calls orderpay server-side with
// the account's secret key (the browser never sees it).
//
// The page makes an intent id (a UUID) when the customer opens the checkout and keeps it in
// sessionStorage. The backend accepts only a UUID from the browser, never a key: each call's
// idempotency key is an HMAC of a server secret, the session, the intent and the operation, so
// a double click, a reload or a retried request sends the same key, while no customer can make a
// key that collides with another's (keys are scoped to the merchant's account, not to customers).
//
//   ORDERPAY_URL, ORDERPAY_KEY            the service and the account's secret key
//   CHECKOUT_SECRET                       the HMAC secret (a random one per process when unset)
//   CHECKOUT_LISTEN                       host:port (127.0.0.1:3000; port 0 for any free port)

import { createHmac, randomBytes } from "node:crypto";
import { readFile } from "node:fs/promises";
import { createServer } from "node:http";
import { OrderpayClient } from "@orderpay/client";

const secret = process.env.CHECKOUT_SECRET ?? randomBytes(32).toString("hex");
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;
const SESSION = /^[0-9a-f]{32}$/;
const CART = { currency: "USD", items: [{ sku: "tee", quantity: 2, unit_price: "19.99" }] };

/** Keys derived from (session, intent, operation); when each was first sent, in this process's memory. */
class DerivedKeyStore {
  sent = new Map();
  async load(intent, operation) {
    const key = createHmac("sha256", secret).update(`${intent}\n${operation}`).digest("hex");
    return { key, firstSentAtMs: this.sent.get(key) };
  }
  async save(_intent, _operation, stored) {
    this.sent.set(stored.key, stored.firstSentAtMs);
  }
}

const orderpay = new OrderpayClient({
  baseUrl: process.env.ORDERPAY_URL ?? "http://127.0.0.1:8080",
  apiKey: process.env.ORDERPAY_KEY ?? "",
  keyStore: new DerivedKeyStore(),
  maxRetries: 5,
  deadlineMs: Number(process.env.CHECKOUT_DEADLINE_MS ?? 30_000),
});

/** The order of this session's intent (created once: the same key replays it) and its payment. */
async function checkout(session, intent) {
  const scoped = `${session}\n${intent}`;
  const created = await orderpay.createOrder({ ...CART, metadata: { intent } }, { intent: scoped });
  // A replay is the creation's answer: read the order as it is now.
  const order = (await orderpay.getOrder(created.value.id)).value;
  const paymentId = order.payment_ids.at(-1);
  const payment = paymentId ? (await orderpay.getPayment(paymentId)).value : undefined;
  return { scoped, order, payment };
}

function state({ order, payment }) {
  return {
    order_id: order.id,
    order_status: order.status,
    total: `${order.total_amount} ${order.currency}`,
    payment_id: payment?.id ?? null,
    payment_status: payment?.status ?? null,
  };
}

async function api(request, session, body) {
  if (!UUID.test(body?.intent ?? "")) return [400, { error: "intent must be a UUID" }];
  const found = await checkout(session, body.intent);
  if (request.url === "/api/checkout") return [200, state(found)];
  if (request.url === "/api/pay") {
    try {
      const paid = await orderpay.payAndWait({ order_id: found.order.id, payment_method: body.payment_method ?? "pm_card_ok" }, { intent: found.scoped });
      return [200, state({ order: (await orderpay.getOrder(found.order.id)).value, payment: paid.value })];
    } catch (error) {
      if (error.kind === "api") return [402, { ...state(await checkout(session, body.intent)), error: error.problem?.detail ?? error.message }];
      throw error;
    }
  }
  return [404, { error: "no such endpoint" }];
}

function sessionOf(request) {
  const cookie = /(?:^|;\s*)sid=([0-9a-f]{32})/.exec(request.headers.cookie ?? "");
  return cookie && SESSION.test(cookie[1]) ? cookie[1] : undefined;
}

const pages = { "/": ["index.html", "text/html"], "/app.js": ["app.js", "text/javascript"] };

const server = createServer(async (request, response) => {
  const send = (status, body, headers = {}) => {
    response.writeHead(status, { "cache-control": "no-store", ...headers });
    response.end(body);
  };
  try {
    if (request.method === "GET" && pages[request.url]) {
      const [file, type] = pages[request.url];
      const headers = { "content-type": `${type}; charset=utf-8` };
      if (!sessionOf(request)) headers["set-cookie"] = `sid=${randomBytes(16).toString("hex")}; HttpOnly; SameSite=Strict; Path=/`;
      return send(200, await readFile(new URL(`public/${file}`, import.meta.url)), headers);
    }
    const session = sessionOf(request);
    if (request.method !== "POST" || !request.url.startsWith("/api/") || !session) return send(404, "not found");
    const chunks = [];
    for await (const chunk of request) chunks.push(chunk);
    let body;
    try {
      body = JSON.parse(Buffer.concat(chunks).toString("utf8") || "{}");
    } catch {
      return send(400, JSON.stringify({ error: "not JSON" }), { "content-type": "application/json" });
    }
    const [status, answer] = await api(request, session, body);
    send(status, JSON.stringify(answer), { "content-type": "application/json" });
  } catch (error) {
    // orderpay did not answer finally (still in progress, unreachable): the page tries again.
    console.error(error.message);
    send(503, JSON.stringify({ error: "try again", resumable: error.resumable ?? false }), { "content-type": "application/json" });
  }
});

const [host, port] = (process.env.CHECKOUT_LISTEN ?? "127.0.0.1:3000").split(":");
server.listen(Number(port), host, () => console.log(`checkout listening on http://${host}:${server.address().port}`));
