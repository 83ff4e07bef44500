// Idempotency keys: one per call, sent unchanged on every attempt, and kept by a KeyStore per
// (intent, operation), so that a process that restarted resumes with the same key. A key is
// bound to its route at the service: creating an order and paying it are two keys of one intent.

/** The key of one (intent, operation), and when it was first sent (ms since the epoch). */
export interface StoredKey {
  key: string;
  firstSentAtMs?: number;
}

/**
 * Where the keys of intents live. `save` resolves once the key is durable where the caller needs
 * it: the client saves a new key, with its first send's time, before that send. The first key
 * saved for an (intent, operation) is the one kept: saving another changes nothing (saving the
 * same key may record its first send's time). The client reads the key back after saving it, so
 * two sends of one intent racing each other share the key that won.
 */
export interface KeyStore {
  load(intent: string, operation: string): Promise<StoredKey | undefined>;
  save(intent: string, operation: string, key: StoredKey): Promise<void>;
}

/** Keys in this process's memory: they survive retries and resumed calls, not a restart. */
export class MemoryKeyStore implements KeyStore {
  private readonly keys = new Map<string, StoredKey>();

  async load(intent: string, operation: string): Promise<StoredKey | undefined> {
    const found = this.keys.get(`${intent}\u001f${operation}`);
    return found && { ...found };
  }

  async save(intent: string, operation: string, key: StoredKey): Promise<void> {
    const slot = `${intent}\u001f${operation}`;
    const kept = this.keys.get(slot);
    if (!kept) this.keys.set(slot, { ...key });
    else if (kept.key === key.key && kept.firstSentAtMs === undefined && key.firstSentAtMs !== undefined) {
      this.keys.set(slot, { ...kept, firstSentAtMs: key.firstSentAtMs });
    }
  }
}

/** Whether the service accepts `key`: 1 to 255 visible ASCII characters (0x21-0x7E). */
export function validKey(key: string): boolean {
  return /^[\x21-\x7e]{1,255}$/.test(key);
}

/** Whether a key first sent at `firstSentAtMs` is older than `ttlMs` at `nowMs`. */
export function expired(key: StoredKey, ttlMs: number, nowMs: number): boolean {
  return key.firstSentAtMs !== undefined && nowMs - key.firstSentAtMs > ttlMs;
}

async function webCrypto(): Promise<Crypto> {
  if (globalThis.crypto?.subtle) return globalThis.crypto;
  // Node 18 without the global: the same Web Crypto from node:crypto.
  const { webcrypto } = (await import("node:crypto" as string)) as { webcrypto: Crypto };
  return webcrypto;
}

/** A new key: a random UUID (v4). */
export async function newKey(): Promise<string> {
  const bytes = (await webCrypto()).getRandomValues(new Uint8Array(16));
  bytes[6] = (bytes[6]! & 0x0f) | 0x40;
  bytes[8] = (bytes[8]! & 0x3f) | 0x80;
  const hex = Array.from(bytes, (byte) => byte.toString(16).padStart(2, "0")).join("");
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
}

export { webCrypto };
