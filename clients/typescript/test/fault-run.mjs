// The fault run of the TypeScript client: intents (create an order, pay it) through the fault
// proxy with 20% of exchanges faulted, counted in the database and at the mock provider. Run by
// test/service.test.mjs at CI size, and by `make clients-faults` at full size:
//
//   node test/fault-run.mjs INTENTS MODES   (MODES: retries,defaults,naive)

import { MemoryKeyStore, OrderpayClient } from "../dist/index.js";
import { charges, count, countLater, order, service, startProxy, text } from "./support.mjs";

function percentile(sorted, share) {
  return sorted[Math.min(Math.max(Math.ceil(sorted.length * share), 1), sorted.length) - 1];
}

const settingsOf = {
  retries: { maxRetries: 10, deadlineMs: 30_000 },
  defaults: {},
  naive: { maxRetries: 0 },
};

const names = {
  retries: "retries (max 10, 30 s)",
  defaults: "defaults (max 2, 60 s)",
  naive: "naive (no retries, no keys)",
};

/** Calls until a success: resumed with the intent's stored key (naive: sent again as a new request). */
async function untilSuccess(mode, tally, call, intent) {
  for (;;) {
    try {
      const reply = await call(mode === "naive" ? {} : { intent });
      tally.attempts += reply.attempts;
      return reply.value;
    } catch (error) {
      tally.attempts += error.attempts ?? 0;
      // A naive app's second payment finds the order paid by its first: done.
      if (mode === "naive" && error.problem?.type === "invalid-state") return undefined;
      if (mode !== "naive" && !error.resumable) throw error;
      tally.resumes += 1;
    }
  }
}

export async function faultRun({ mode, intents, inFlight = 16 }) {
  const run = `${mode}-${Date.now()}-${Math.random().toString(36).slice(2)}`;
  const proxy = await startProxy({ rate: 0.2, delay_ms: 200 });
  const client = new OrderpayClient({ baseUrl: proxy.url, apiKey: service.key, keyStore: new MemoryKeyStore(), ...settingsOf[mode] });
  const duplicatesSql = `SELECT count(*) FROM (SELECT metadata->>'intent' FROM orders WHERE metadata->>'run' = '${run}' GROUP BY 1 HAVING count(*) > 1) AS d`;
  let mostDuplicated = 0;
  let running = true;
  const sampler = (async () => {
    while (running) {
      mostDuplicated = Math.max(mostDuplicated, await countLater(duplicatesSql));
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
  })();
  const started = Date.now();
  const results = [];
  let next = 0;
  const worker = async () => {
    while (next < intents) {
      const intent = `intent-${next++}`;
      const began = Date.now();
      const tally = { attempts: 0, resumes: 0 };
      const created = await untilSuccess(mode, tally, (key) => client.createOrder(order(intent, run), key), intent);
      await untilSuccess(mode, tally, (key) => client.payAndWait({ order_id: created.id, payment_method: "pm_card_ok" }, key), intent);
      results.push({ ...tally, took: Date.now() - began });
    }
  };
  try {
    await Promise.all(Array.from({ length: inFlight }, worker));
  } finally {
    running = false;
    await sampler;
  }
  const took = (Date.now() - started) / 1000;
  const stats = await proxy.stats();
  proxy.stop();

  const orders = count(`SELECT count(*) FROM orders WHERE metadata->>'run' = '${run}'`);
  const duplicated = count(duplicatesSql);
  const paid = count(`SELECT count(*) FROM orders WHERE metadata->>'run' = '${run}' AND status = 'paid'`);
  const runPayments = new Set(
    text(
      `SELECT coalesce(string_agg(p.id::text, ','), '') FROM payments p JOIN orders o ON o.account_id = p.account_id AND o.id = p.order_id WHERE o.metadata->>'run' = '${run}'`,
    ).split(","),
  );
  const succeeded = (await charges()).filter((charge) => charge.status === "succeeded");
  const paidOrders = count(
    `SELECT count(*) FROM payments p JOIN orders o ON o.account_id = p.account_id AND o.id = p.order_id WHERE o.metadata->>'run' = '${run}' AND p.status = 'succeeded'`,
  );
  const charged = succeeded.filter((charge) => runPayments.has(charge.reference)).length;
  const attempts = results.map((result) => result.attempts).sort((a, b) => a - b);
  const times = results.map((result) => result.took).sort((a, b) => a - b);
  const faulted = stats.drop + stats.reset + stats.unavailable + stats.delay;
  const line =
    `typescript | ${names[mode]} | ${intents} intents, ${intents * 2} calls | ${stats.exchanges} exchanges, ${faulted} faulted ` +
    `(drop ${stats.drop}, reset ${stats.reset}, 503 ${stats.unavailable}, delay ${stats.delay}) | ` +
    `${results.filter((result) => result.resumes > 0).length} intents resumed | duplicates: ${orders - intents} orders, ${charged - paid} charges | ` +
    `attempts per intent p50 ${percentile(attempts, 0.5)} p99 ${percentile(attempts, 0.99)} | ` +
    `time to success p50 ${percentile(times, 0.5)} ms p99 ${percentile(times, 0.99)} ms | ${took.toFixed(1)} s`;
  return { line, intents, orders, duplicated, mostDuplicated, paid, paidOrders, charged, faulted };
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const intents = Number(process.argv[2] ?? 1000);
  const modes = (process.argv[3] ?? "retries,defaults,naive").split(",");
  for (const mode of modes) {
    const result = await faultRun({ mode, intents });
    console.log(result.line);
  }
}
