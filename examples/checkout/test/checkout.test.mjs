// The checkout in headless Chromium (Debian's, driven by puppeteer-core) against a real orderpay
// (run through tests/scripts/with-service.sh: `make checkout-check`), with the fault proxy between
// the backend and orderpay. Each thing people do ends with one order and one charge, and the page
// shows the final state. A screenshot of each end is left in target/checkout/.

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdirSync } from "node:fs";
import { createInterface } from "node:readline";
import { after, before, test } from "node:test";
import puppeteer from "puppeteer-core";
import { charges, count, service, startProxy, text } from "../../../clients/typescript/test/support.mjs";

const shots = new URL("../../../target/checkout/", import.meta.url).pathname;
let proxy;
let backend;
let base;
let browser;

before(async () => {
  mkdirSync(shots, { recursive: true });
  proxy = await startProxy({});
  backend = spawn(process.execPath, [new URL("../server.mjs", import.meta.url).pathname], {
    env: { ...process.env, ORDERPAY_URL: proxy.url, CHECKOUT_LISTEN: "127.0.0.1:0" },
    stdio: ["ignore", "pipe", "inherit"],
  });
  const line = await new Promise((resolve) => createInterface({ input: backend.stdout }).once("line", resolve));
  base = line.replace("checkout listening on ", "").trim();
  browser = await puppeteer.launch({
    executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
    headless: true,
    userDataDir: (await import("node:fs")).mkdtempSync("/tmp/checkout-chromium-"),
    args: [
      "--no-sandbox",
      "--disable-gpu",
      "--disable-quic",
      "--no-first-run",
      "--disable-background-networking",
      "--disable-component-update",
      "--disable-sync",
    ],
  });
});

after(async () => {
  await browser?.close();
  backend?.kill();
  proxy?.stop();
});

/** A new customer (own cookies and sessionStorage) at the checkout, ready to pay. */
async function customer() {
  const context = await browser.createBrowserContext();
  const page = await context.newPage();
  await page.goto(base);
  await page.waitForSelector('#state[data-state="ready"]');
  const intent = await page.evaluate(() => sessionStorage.getItem("checkout-intent"));
  assert.match(intent, /^[0-9a-f-]{36}$/);
  return { page, intent, context };
}

/** The page shows the order paid; the intent has one order with one payment and one charge. */
async function paidOnce({ page, intent, context }, name) {
  await page.waitForSelector('#state[data-state="paid"]', { timeout: 30_000 });
  const shown = await page.$eval("#state", (element) => element.textContent);
  await page.screenshot({ path: `${shots}${name}.png` });
  assert.equal(count(`SELECT count(*) FROM orders WHERE metadata->>'intent' = '${intent}'`), 1, "one order");
  const orderId = text(`SELECT id FROM orders WHERE metadata->>'intent' = '${intent}'`);
  assert.ok(shown.includes(orderId), shown);
  const payments = text(`SELECT string_agg(id::text, ',') FROM payments WHERE order_id = '${orderId}'`).split(",");
  assert.equal(payments.length, 1, "one payment");
  assert.ok(shown.includes(payments[0]), shown);
  const charged = (await charges()).filter((charge) => charge.reference === payments[0]);
  assert.deepEqual(charged.map((charge) => charge.status), ["succeeded"], "one charge");
  assert.equal(text(`SELECT status FROM orders WHERE id = '${orderId}'`), "paid");
  await context.close();
}

test("a double click on Pay pays once", async () => {
  const shopper = await customer();
  await shopper.page.click("#pay", { clickCount: 2 });
  await paidOnce(shopper, "double-click");
});

test("a reload while the pay call is held ends paid once", async () => {
  const shopper = await customer();
  const held = (await proxy.stats()).held;
  await proxy.set({ hold: "POST /payments" });
  try {
    await shopper.page.click("#pay");
    for (let waited = 0; (await proxy.stats()).held === held; waited += 20) {
      assert.ok(waited < 10_000, "the pay call reached the proxy");
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    await shopper.page.reload();
    await paidOnce(shopper, "reload-while-held");
  } finally {
    await proxy.set({});
  }
});

test("the browser offline across the pay click pays once when it is back", async () => {
  const shopper = await customer();
  await shopper.page.setOfflineMode(true);
  await shopper.page.click("#pay");
  await shopper.page.waitForSelector('#state[data-state="retrying"]');
  await shopper.page.setOfflineMode(false);
  await paidOnce(shopper, "offline");
});

test("the backend's pay call dropped after orderpay answered pays once", async () => {
  const shopper = await customer();
  const dropped = (await proxy.stats()).drop;
  await proxy.set({ rate: 1, kinds: ["drop"], paths: ["/payments"], times: 1 });
  try {
    await shopper.page.click("#pay");
    await paidOnce(shopper, "dropped-answer");
    assert.equal((await proxy.stats()).drop, dropped + 1, "the answer was dropped once");
  } finally {
    await proxy.set({});
  }
});
