// Verifying orderpay's merchant webhooks (Standard Webhooks) and reading their events.
//
// orderpay signs `{webhook-id}.{webhook-timestamp}.{body}` with HMAC-SHA256 under the endpoint's
// secret (`whsec_<base64>`; the key is the decoded bytes) and sends `webhook-signature:
// v1,<base64>`; during a rotation the header holds two signatures, the new secret's first. A
// message is genuine when one signature matches one secret and its timestamp is within the
// tolerance of the receiver's clock.

import { webCrypto } from "./keys.js";
import type { Event } from "./types.js";

export class WebhookError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "WebhookError";
  }
}

export interface VerifyOptions {
  /** The endpoint's secrets (`whsec_...`): one, or two during a rotation. */
  secrets: string[];
  /** The delivery's headers: a Headers, or an object of lower-case names. */
  headers: Headers | Record<string, string | string[] | undefined>;
  /** The body exactly as received. */
  body: string | Uint8Array;
  /** How far the timestamp may be from now, in seconds (300). */
  toleranceSec?: number;
  /** Now, in Unix seconds (the clock's by default). */
  nowSec?: number;
}

function base64ToBytes(text: string): Uint8Array<ArrayBuffer> | undefined {
  if (!/^[A-Za-z0-9+/]*={0,2}$/.test(text)) return undefined;
  const binary = atob(text);
  return Uint8Array.from(binary, (char) => char.charCodeAt(0));
}

function bytesToBase64(bytes: Uint8Array): string {
  return btoa(String.fromCharCode(...bytes));
}

function header(headers: VerifyOptions["headers"], name: string): string | undefined {
  if (typeof (headers as Headers).get === "function") return (headers as Headers).get(name) ?? undefined;
  const value = (headers as Record<string, string | string[] | undefined>)[name];
  return Array.isArray(value) ? value[0] : value;
}

function equal(a: Uint8Array, b: Uint8Array): boolean {
  if (a.length !== b.length) return false;
  let difference = 0;
  for (let index = 0; index < a.length; index++) difference |= a[index]! ^ b[index]!;
  return difference === 0;
}

async function hmac(secret: string, id: string, timestamp: string, body: Uint8Array): Promise<Uint8Array> {
  const key = base64ToBytes(secret.trim().replace(/^whsec_/, ""));
  if (!key || key.length === 0) throw new WebhookError("a webhook secret is whsec_ followed by base64");
  const subtle = (await webCrypto()).subtle;
  const imported = await subtle.importKey("raw", key, { name: "HMAC", hash: "SHA-256" }, false, ["sign"]);
  const prefix = new TextEncoder().encode(`${id}.${timestamp}.`);
  const message = new Uint8Array(prefix.length + body.length);
  message.set(prefix);
  message.set(body, prefix.length);
  return new Uint8Array(await subtle.sign("HMAC", imported, message));
}

/** The `webhook-signature` of a message under `secret`, as orderpay sends it (for receiver tests). */
export async function sign(secret: string, id: string, timestampSec: number, body: string | Uint8Array): Promise<string> {
  const bytes = typeof body === "string" ? new TextEncoder().encode(body) : body;
  return `v1,${bytesToBase64(await hmac(secret, id, String(timestampSec), bytes))}`;
}

/** Verifies a delivery and returns its event; throws a WebhookError otherwise. */
export async function verifyWebhook(options: VerifyOptions): Promise<Event> {
  const id = header(options.headers, "webhook-id");
  const timestamp = header(options.headers, "webhook-timestamp");
  const signatures = header(options.headers, "webhook-signature");
  if (!id || !timestamp || !signatures) throw new WebhookError("the webhook-id, webhook-timestamp and webhook-signature headers are required");
  if (!/^\d+$/.test(timestamp.trim())) throw new WebhookError("the webhook-timestamp header is not a number of seconds");
  const now = options.nowSec ?? Math.floor(Date.now() / 1000);
  if (Math.abs(Number(timestamp.trim()) - now) > (options.toleranceSec ?? 300)) {
    throw new WebhookError("the timestamp is more than the tolerance away from now");
  }
  const body = typeof options.body === "string" ? new TextEncoder().encode(options.body) : options.body;
  const sent = signatures
    .split(" ")
    .filter((signature) => signature.startsWith("v1,"))
    .map((signature) => base64ToBytes(signature.slice(3)))
    .filter((bytes): bytes is Uint8Array<ArrayBuffer> => bytes !== undefined);
  let matched = false;
  for (const secret of options.secrets) {
    const expected = await hmac(secret, id, timestamp.trim(), body);
    if (sent.some((signature) => equal(signature, expected))) matched = true;
  }
  if (!matched) throw new WebhookError("no signature matches a secret");
  try {
    return JSON.parse(new TextDecoder().decode(body)) as Event;
  } catch (error) {
    throw new WebhookError(`the body is not an orderpay event: ${String(error)}`);
  }
}
