// What the service tests share: the service of tests/scripts/with-service.sh (ORDERPAY_URL,
// ORDERPAY_KEY, MOCK_PROVIDER_URL, DATABASE_URL), the fault proxy program, and counts in the
// database (psql) and at the mock provider.

import { execFile, execFileSync, spawn } from "node:child_process";
import { createInterface } from "node:readline";
import { promisify } from "node:util";

export const service = {
  url: process.env.ORDERPAY_URL,
  key: process.env.ORDERPAY_KEY,
  mock: process.env.MOCK_PROVIDER_URL,
  database: process.env.DATABASE_URL,
};

const proxyBin = process.env.FAULT_PROXY_BIN ?? new URL("../../../target/debug/fault-proxy", import.meta.url).pathname;

/** Starts the fault proxy in front of the service; `faults` as POST /_faults takes them. */
export async function startProxy(faults = {}) {
  const upstream = new URL(service.url).host;
  const child = spawn(proxyBin, ["--upstream", upstream], { stdio: ["ignore", "pipe", "inherit"] });
  const line = await new Promise((resolve, reject) => {
    child.once("error", reject);
    child.once("exit", (code) => reject(new Error(`fault-proxy exited with ${code}`)));
    createInterface({ input: child.stdout }).once("line", resolve);
  });
  const url = `http://${line.replace("listening on ", "").trim()}`;
  const admin = async (path, body) => {
    const response = await fetch(`${url}${path}`, { method: body === undefined ? "GET" : "POST", body: body === undefined ? undefined : JSON.stringify(body) });
    if (!response.ok) throw new Error(`${path}: ${response.status} ${await response.text()}`);
    return response.json();
  };
  await admin("/_faults", faults);
  return {
    url,
    stats: () => admin("/_faults"),
    set: (next) => admin("/_faults", next),
    release: () => admin("/_faults/release", {}),
    stop: () => {
      child.removeAllListeners("exit");
      child.kill();
    },
  };
}

/** One value from the service's database, as text. */
export function text(sql) {
  return execFileSync("psql", [service.database, "-Atc", sql], { encoding: "utf8" }).trim();
}

/** One number from the service's database. */
export function count(sql) {
  return Number(text(sql));
}

/** One number from the service's database, without holding up the event loop meanwhile. */
export async function countLater(sql) {
  const { stdout } = await promisify(execFile)("psql", [service.database, "-Atc", sql], { encoding: "utf8" });
  return Number(stdout.trim());
}

/** Every charge the mock provider made. */
export async function charges() {
  const response = await fetch(`${service.mock}/_admin/charges`);
  return (await response.json()).data;
}

export function order(intent, run = "tests") {
  return { currency: "USD", items: [{ sku: "tee", quantity: 2, unit_price: "19.99" }], metadata: { intent, run } };
}
