// The retry rules, as one pure function: what to do after an attempt's outcome. The same rules
// are written as test vectors in clients/retry-rules.json, which both clients' tests load.
//
// Retried: a refused or reset connection, a timeout before any response byte, 409
// idempotency-key-in-use and payment-in-progress, 429 with Retry-After, 500, 502, 503, 504.
// Stopped: everything else. Orderpay-Should-Retry, when sent, has the last word. The delay before
// retry n is min(base x 2^(n-1), cap) x U[0.5, 1), at least the floor; Retry-After replaces it;
// no retry past the deadline. A 202 is a success whose status is processing; the *AndWait calls
// re-send it until a final answer, bounded by the deadline only.

/** Every setting of the retries, in milliseconds; all public. */
export interface Settings {
  /** Retries after the first attempt. */
  maxRetries: number;
  backoffBaseMs: number;
  backoffCapMs: number;
  backoffFloorMs: number;
  /** One attempt's limit: above the service's provider timeout (5 s). */
  timeoutMs: number;
  /** The whole call's limit, retries and waits included. */
  deadlineMs: number;
  /** The age past which a stored key is not sent again (the service keeps a key 24 h). */
  keyTtlMs: number;
}

export const DEFAULT_SETTINGS: Readonly<Settings> = Object.freeze({
  maxRetries: 2,
  backoffBaseMs: 500,
  backoffCapMs: 5000,
  backoffFloorMs: 500,
  timeoutMs: 30_000,
  deadlineMs: 60_000,
  keyTtlMs: 23 * 3600 * 1000,
});

export type Transport = "refused" | "reset" | "timeout" | "tls" | "other";

/** What one attempt got: an answer, or a transport failure. */
export type Outcome =
  | { status: number; type?: string; retryAfterMs?: number; shouldRetry?: boolean }
  | { transport: Transport };

export type Stop = "api" | "key_reused" | "in_progress" | "transport" | "deadline";

export type Decision = { action: "done" } | { action: "retry"; delayMs: number } | { action: "stop"; error: Stop };

/** The delay before retry `retry` (1 for the first), for a uniform `random` in [0, 1). */
export function backoff(settings: Settings, retry: number, random: number): number {
  const doubled = settings.backoffBaseMs * 2 ** Math.min(Math.max(retry - 1, 0), 20);
  const capped = Math.min(doubled, settings.backoffCapMs);
  const jittered = capped * (0.5 + 0.5 * Math.min(Math.max(random, 0), 1));
  return Math.max(Math.round(jittered), settings.backoffFloorMs);
}

function retryable(outcome: Outcome): boolean {
  if ("transport" in outcome) return outcome.transport === "refused" || outcome.transport === "reset" || outcome.transport === "timeout";
  switch (outcome.status) {
    case 409:
      return outcome.type === "idempotency-key-in-use" || outcome.type === "payment-in-progress";
    case 429:
      return outcome.retryAfterMs !== undefined;
    case 500:
    case 502:
    case 503:
    case 504:
      return true;
    default:
      return false;
  }
}

function stopFor(outcome: Outcome): Stop {
  if ("transport" in outcome) return "transport";
  if (outcome.status === 202 || (outcome.status === 409 && retryable(outcome))) return "in_progress";
  if (outcome.status === 422 && outcome.type === "idempotency-key-reused") return "key_reused";
  return "api";
}

/**
 * What to do after `attempt` (1 for the first send) got `outcome`, with `remainingMs` left before
 * the deadline and `random` uniform in [0, 1). `waiting`: a 202 is not final.
 */
export function decide(
  settings: Settings,
  attempt: number,
  outcome: Outcome,
  waiting: boolean,
  remainingMs: number,
  random: number,
): Decision {
  const status = "status" in outcome ? outcome.status : undefined;
  const processing = status === 202;
  if (status !== undefined && status >= 200 && status < 300 && !(processing && waiting)) return { action: "done" };
  if (!processing) {
    const allowed = "status" in outcome && outcome.shouldRetry !== undefined ? outcome.shouldRetry : retryable(outcome);
    if (!allowed || attempt > settings.maxRetries) return { action: "stop", error: stopFor(outcome) };
  }
  const retryAfter = "status" in outcome ? outcome.retryAfterMs : undefined;
  const delayMs = retryAfter ?? backoff(settings, attempt, random);
  if (delayMs > remainingMs) return { action: "stop", error: "deadline" };
  return { action: "retry", delayMs };
}

/** Retry-After in seconds, as milliseconds (an HTTP date is not used by orderpay, and is ignored). */
export function parseRetryAfter(value: string | null): number | undefined {
  if (value === null || !/^\s*\d+\s*$/.test(value)) return undefined;
  return Number(value.trim()) * 1000;
}
