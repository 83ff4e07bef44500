// The client: one method per operation, each call sent with its idempotency key and retried by
// the rules of ./retry.ts. Runs wherever fetch does (Node 18+, browsers); no other dependency.

import { OrderpayError, type Problem } from "./errors.js";
import { expired, type KeyStore, MemoryKeyStore, newKey, validKey } from "./keys.js";
import { COVERED } from "./operations.js";
import { decide, DEFAULT_SETTINGS, parseRetryAfter, type Outcome, type Settings, type Stop, type Transport } from "./retry.js";
import type * as T from "./types.js";

/** Which key a write is sent with: a new one (the default), the caller's, or the intent's stored one. */
export interface KeyOptions {
  /** The caller's key (1 to 255 visible ASCII characters). */
  key?: string;
  /** The intent whose key for this operation the client's KeyStore holds (made and saved before the first send). */
  intent?: string;
}

/** What a hook is told about one attempt. */
export interface AttemptInfo {
  method: string;
  path: string;
  key: string | undefined;
  /** 1 for the first send. */
  attempt: number;
  /** The answer's status (response hooks; undefined without an answer). */
  status?: number;
  /** Since the attempt was sent (response hooks). */
  elapsedMs?: number;
}

export interface ClientOptions extends Partial<Settings> {
  /** Such as http://127.0.0.1:8080. */
  baseUrl: string;
  /** The account's secret key: server-side only. */
  apiKey: string;
  /** Where intents' keys live (in memory by default). */
  keyStore?: KeyStore;
  onRequest?: (attempt: AttemptInfo) => void;
  onResponse?: (attempt: AttemptInfo) => void;
  /** The fetch to use (the global one by default). */
  fetch?: typeof fetch;
}

/** A success: the resource, and how it came. */
export interface Reply<V> {
  value: V;
  /** 200, 201, or 202 (processing: the outcome is not known yet). */
  status: number;
  /** The stored answer of an earlier request with the same key (Idempotent-Replayed). */
  replayed: boolean;
  attempts: number;
  key: string | undefined;
  /** A 202: send the same call again, or wait for it (the *AndWait calls do). */
  processing: boolean;
}

interface Answer {
  status: number;
  retryAfterMs: number | undefined;
  shouldRetry: boolean | undefined;
  replayed: boolean;
  text: string;
}

function classify(error: unknown): Transport {
  const failure = error as { name?: string; cause?: { code?: string; name?: string } };
  if (failure?.name === "TimeoutError" || failure?.name === "AbortError") return "timeout";
  const code = failure?.cause?.code ?? "";
  if (code === "ECONNREFUSED") return "refused";
  if (code === "UND_ERR_CONNECT_TIMEOUT" || code === "UND_ERR_HEADERS_TIMEOUT" || code === "ETIMEDOUT") return "timeout";
  if (/CERT|TLS|SSL|SELF_SIGNED|UNABLE_TO_VERIFY/.test(code)) return "tls";
  // A reset, a socket closed before the answer, or a browser's "Failed to fetch".
  if (error instanceof TypeError) return "reset";
  return "other";
}

function problemOf(text: string): Problem | undefined {
  try {
    const parsed = JSON.parse(text) as Problem;
    return typeof parsed?.type === "string" ? parsed : undefined;
  } catch {
    return undefined;
  }
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** An orderpay client. */
export class OrderpayClient {
  readonly settings: Settings;
  readonly keyStore: KeyStore;
  private readonly baseUrl: string;
  private readonly apiKey: string;
  private readonly fetch: typeof fetch;
  private readonly onRequest: ClientOptions["onRequest"];
  private readonly onResponse: ClientOptions["onResponse"];

  constructor(options: ClientOptions) {
    const { baseUrl, apiKey, keyStore, onRequest, onResponse, fetch: fetchImplementation, ...settings } = options;
    this.settings = { ...DEFAULT_SETTINGS, ...Object.fromEntries(Object.entries(settings).filter(([, value]) => value !== undefined)) };
    this.baseUrl = baseUrl.replace(/\/+$/, "");
    this.apiKey = apiKey;
    this.keyStore = keyStore ?? new MemoryKeyStore();
    this.fetch = fetchImplementation ?? globalThis.fetch.bind(globalThis);
    this.onRequest = onRequest;
    this.onResponse = onResponse;
  }

  // Orders
  createOrder(order: T.CreateOrder, options: KeyOptions = {}) {
    return this.write<T.Order>("createOrder", undefined, order, options, false);
  }
  listOrders(params: T.ListParams = {}) {
    return this.read<T.List<T.Order>>("listOrders", undefined, params);
  }
  getOrder(id: string) {
    return this.read<T.Order>("getOrder", id);
  }
  cancelOrder(id: string, options: KeyOptions = {}) {
    return this.write<T.Order>("cancelOrder", id, undefined, options, false);
  }

  // Payments
  /** POST /payments: a 202 (processing) is a success; see payAndWait. */
  createPayment(payment: T.CreatePayment, options: KeyOptions = {}) {
    return this.write<T.Payment>("createPayment", undefined, payment, options, false);
  }
  /** POST /payments, re-sent with the same key while it answers 202, until its final answer or the deadline. */
  payAndWait(payment: T.CreatePayment, options: KeyOptions = {}) {
    return this.write<T.Payment>("createPayment", undefined, payment, options, true);
  }
  listPayments(params: T.PaymentListParams = {}) {
    return this.read<T.List<T.Payment>>("listPayments", undefined, params);
  }
  getPayment(id: string) {
    return this.read<T.Payment>("getPayment", id);
  }
  capturePayment(id: string, capture: T.Capture = {}, options: KeyOptions = {}) {
    return this.write<T.Payment>("capturePayment", id, capture, options, false);
  }
  captureAndWait(id: string, capture: T.Capture = {}, options: KeyOptions = {}) {
    return this.write<T.Payment>("capturePayment", id, capture, options, true);
  }
  voidPayment(id: string, options: KeyOptions = {}) {
    return this.write<T.Payment>("voidPayment", id, undefined, options, false);
  }

  // Refunds
  createRefund(refund: T.CreateRefund, options: KeyOptions = {}) {
    return this.write<T.Refund>("createRefund", undefined, refund, options, false);
  }
  refundAndWait(refund: T.CreateRefund, options: KeyOptions = {}) {
    return this.write<T.Refund>("createRefund", undefined, refund, options, true);
  }
  listRefunds(params: T.RefundListParams = {}) {
    return this.read<T.List<T.Refund>>("listRefunds", undefined, params);
  }
  getRefund(id: string) {
    return this.read<T.Refund>("getRefund", id);
  }

  // Books
  listBalanceTransactions(params: T.BalanceTransactionListParams = {}) {
    return this.read<T.List<T.BalanceTransaction>>("listBalanceTransactions", undefined, params);
  }

  // Disputes
  listDisputes(params: T.DisputeListParams = {}) {
    return this.read<T.List<T.Dispute>>("listDisputes", undefined, params);
  }
  getDispute(id: string) {
    return this.read<T.Dispute>("getDispute", id);
  }
  /** POST /disputes/{id}/evidence: text evidence, submitted to the provider once (202 while its outcome is unknown). */
  submitDisputeEvidence(id: string, evidence: T.DisputeEvidence, options: KeyOptions = {}) {
    return this.write<T.Dispute>("submitDisputeEvidence", id, evidence, options, false);
  }
  /** POST /disputes/{id}/accept: closes the dispute without contest. */
  acceptDispute(id: string, options: KeyOptions = {}) {
    return this.write<T.Dispute>("acceptDispute", id, undefined, options, false);
  }

  // Events
  listEvents(params: T.EventListParams = {}) {
    return this.read<T.List<T.Event>>("listEvents", undefined, params);
  }
  getEvent(id: string) {
    return this.read<T.Event>("getEvent", id);
  }

  // Webhook endpoints
  createWebhookEndpoint(endpoint: T.CreateWebhookEndpoint, options: KeyOptions = {}) {
    return this.write<T.WebhookEndpointWithSecret>("createWebhookEndpoint", undefined, endpoint, options, false);
  }
  listWebhookEndpoints(params: T.ListParams = {}) {
    return this.read<T.List<T.WebhookEndpoint>>("listWebhookEndpoints", undefined, params);
  }
  getWebhookEndpoint(id: string) {
    return this.read<T.WebhookEndpoint>("getWebhookEndpoint", id);
  }
  deleteWebhookEndpoint(id: string) {
    return this.send<T.DeletedWebhookEndpoint>("deleteWebhookEndpoint", id, {}, undefined, undefined, false);
  }
  rotateWebhookEndpointSecret(id: string, options: KeyOptions = {}) {
    return this.write<T.WebhookEndpointWithSecret>("rotateWebhookEndpointSecret", id, undefined, options, false);
  }

  private read<V>(operation: string, id?: string, query: object = {}) {
    return this.send<V>(operation, id, query, undefined, undefined, false);
  }

  private write<V>(operation: string, id: string | undefined, body: unknown, options: KeyOptions, waiting: boolean) {
    return this.send<V>(operation, id, {}, body, options, waiting);
  }

  /** The key a call sends: the caller's, a new one, or the intent's (saved with its first send's time before that send). */
  private async keyFor(operation: string, options: KeyOptions): Promise<string> {
    const invalid = (message: string, key?: string) => new OrderpayError("invalid", message, { attempts: 0, ...(key && { key }) });
    if (options.key !== undefined) {
      if (!validKey(options.key)) throw invalid("a key is 1 to 255 visible ASCII characters (0x21-0x7E)");
      return options.key;
    }
    if (options.intent === undefined) return newKey();
    let stored;
    try {
      stored = (await this.keyStore.load(options.intent, operation)) ?? { key: await newKey() };
    } catch (error) {
      throw invalid(`the key store failed: ${String(error)}`);
    }
    const now = Date.now();
    if (expired(stored, this.settings.keyTtlMs, now)) {
      throw new OrderpayError("key_expired", `the idempotency key ${stored.key} was first sent more than keyTtlMs ago`, {
        key: stored.key,
        attempts: 0,
      });
    }
    if (stored.firstSentAtMs === undefined) {
      stored = { ...stored, firstSentAtMs: now };
      try {
        await this.keyStore.save(options.intent, operation, stored);
        // Another send of the intent may have saved its key first: that one is kept.
        return (await this.keyStore.load(options.intent, operation))?.key ?? stored.key;
      } catch (error) {
        throw invalid(`the key store failed: ${String(error)}`, stored.key);
      }
    }
    return stored.key;
  }

  private async send<V>(
    operation: string,
    id: string | undefined,
    query: object,
    body: unknown,
    keyOptions: KeyOptions | undefined,
    waiting: boolean,
  ): Promise<Reply<V>> {
    const route = COVERED.find(([name]) => name === operation);
    if (!route) throw new OrderpayError("invalid", `unknown operation ${operation}`, { attempts: 0 });
    const [, method, template] = route;
    const path = id === undefined ? template : template.replace("{id}", encodeURIComponent(id));
    const search = new URLSearchParams(
      Object.entries(query).filter(([, value]) => value !== undefined && value !== null).map(([name, value]) => [name, String(value)]),
    ).toString();
    const url = `${this.baseUrl}${path}${search ? `?${search}` : ""}`;
    const key = keyOptions ? await this.keyFor(operation, keyOptions) : undefined;
    const started = Date.now();
    for (let attempt = 1; ; attempt++) {
      const remaining = this.settings.deadlineMs - (Date.now() - started);
      if (remaining <= 0) throw new OrderpayError("deadline", "the call's deadline passed before a final answer", { attempts: attempt - 1, ...(key && { key }) });
      const info: AttemptInfo = { method, path, key, attempt };
      this.onRequest?.(info);
      const sentAt = Date.now();
      let answer: Answer | undefined;
      let failure: unknown;
      try {
        answer = await this.attempt(method, url, body, key, Math.min(this.settings.timeoutMs, remaining));
      } catch (error) {
        failure = error;
      }
      this.onResponse?.({ ...info, ...(answer && { status: answer.status }), elapsedMs: Date.now() - sentAt });
      const outcome: Outcome = answer
        ? { status: answer.status, type: problemOf(answer.text)?.type, retryAfterMs: answer.retryAfterMs, shouldRetry: answer.shouldRetry }
        : { transport: classify(failure) };
      const decision = decide(this.settings, attempt, outcome, waiting, this.settings.deadlineMs - (Date.now() - started), Math.random());
      if (decision.action === "retry") {
        await sleep(decision.delayMs);
        continue;
      }
      const details = { attempts: attempt, ...(key && { key }) };
      if (decision.action === "done" && answer) {
        let value: V;
        try {
          value = JSON.parse(answer.text) as V;
        } catch (error) {
          throw new OrderpayError("decode", `unexpected answer body: ${String(error)}`, { ...details, status: answer.status });
        }
        return { value, status: answer.status, replayed: answer.replayed, attempts: attempt, key, processing: answer.status === 202 };
      }
      throw this.stopped(decision.action === "stop" ? decision.error : "transport", answer, failure, details);
    }
  }

  private stopped(stop: Stop, answer: Answer | undefined, failure: unknown, details: { attempts: number; key?: string }): OrderpayError {
    if (stop === "deadline") return new OrderpayError("deadline", "the call's deadline passed before a final answer", { ...details, cause: failure });
    if (!answer) return new OrderpayError("transport", `transport: ${String((failure as Error)?.cause ?? failure)}`, { ...details, cause: failure });
    const problem = problemOf(answer.text);
    const base = { ...details, status: answer.status, ...(problem && { problem }) };
    if (stop === "in_progress") {
      let resourceId = (problem?.resource_id ?? problem?.payment_id) as string | undefined;
      if (!resourceId) {
        try {
          resourceId = (JSON.parse(answer.text) as { id?: string }).id;
        } catch {
          resourceId = undefined;
        }
      }
      return new OrderpayError("in_progress", `still in progress at the service (last answer ${answer.status})`, { ...base, ...(resourceId && { resourceId }) });
    }
    if (stop === "key_reused") {
      return new OrderpayError("key_reused", `the idempotency key was first used for another request: ${problem?.detail ?? ""}`, base);
    }
    return new OrderpayError("api", `${answer.status} ${problem?.type ?? "about:blank"}: ${problem?.detail ?? answer.text}`, base);
  }

  private async attempt(method: string, url: string, body: unknown, key: string | undefined, timeoutMs: number): Promise<Answer> {
    const headers: Record<string, string> = { authorization: `Bearer ${this.apiKey}` };
    if (key !== undefined) headers["idempotency-key"] = key;
    if (body !== undefined) headers["content-type"] = "application/json";
    const response = await this.fetch(url, {
      method,
      headers,
      ...(body !== undefined && { body: JSON.stringify(body) }),
      signal: AbortSignal.timeout(timeoutMs),
    });
    const shouldRetry = response.headers.get("orderpay-should-retry");
    return {
      status: response.status,
      retryAfterMs: parseRetryAfter(response.headers.get("retry-after")),
      shouldRetry: shouldRetry === null ? undefined : shouldRetry === "true",
      replayed: response.headers.get("idempotent-replayed") === "true",
      text: await response.text(),
    };
  }
}
