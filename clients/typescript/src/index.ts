// orderpay's TypeScript client: every merchant operation of the API, each write sent with an
// idempotency key and retried by the rules every orderpay client shares
// (clients/retry-rules.json; the rules for people: docs/clients.md).

export { OrderpayClient, type ClientOptions, type KeyOptions, type Reply, type AttemptInfo } from "./client.js";
export { OrderpayError, type ErrorKind, type Problem } from "./errors.js";
export { MemoryKeyStore, newKey, validKey, expired, type KeyStore, type StoredKey } from "./keys.js";
export { COVERED, EXCLUDED } from "./operations.js";
export { backoff, decide, parseRetryAfter, DEFAULT_SETTINGS, type Settings, type Outcome, type Decision, type Stop, type Transport } from "./retry.js";
export { verifyWebhook, sign as signWebhook, WebhookError, type VerifyOptions } from "./webhooks.js";
export type * from "./types.js";
