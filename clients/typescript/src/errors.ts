// The client's errors: each says what happened, with the idempotency key the call used and how
// many attempts it made.

/** An application/problem+json answer (RFC 9457): match on `type`. */
export interface Problem {
  type: string;
  title: string;
  status: number;
  detail: string;
  [member: string]: unknown;
}

/**
 * - `api`: a final answer other than a success (a decline, a validation failure, an invalid state...);
 * - `key_reused`: 422 idempotency-key-reused, the key was first sent with another request (a bug
 *   in the caller, never retried);
 * - `in_progress`: still running at the service (409 in use, payment in progress, 202) when the
 *   retries ran out: send the same call again later, or look the resource up;
 * - `transport`: no answer (not retried, or the retries ran out);
 * - `deadline`: the call's deadline came before a final answer;
 * - `key_expired`: the stored key was first sent longer ago than keyTtlMs: look the resource up;
 * - `invalid`: nothing was sent (a key the service would refuse, a failing key store);
 * - `decode`: a success whose body is not JSON.
 */
export type ErrorKind = "api" | "key_reused" | "in_progress" | "transport" | "deadline" | "key_expired" | "invalid" | "decode";

export class OrderpayError extends Error {
  readonly kind: ErrorKind;
  readonly key: string | undefined;
  readonly attempts: number;
  readonly status: number | undefined;
  readonly problem: Problem | undefined;
  /** For `in_progress`: the resource being made (a payment's id), when the service said. */
  readonly resourceId: string | undefined;

  constructor(
    kind: ErrorKind,
    message: string,
    details: { key?: string; attempts: number; status?: number; problem?: Problem; resourceId?: string; cause?: unknown },
  ) {
    super(`${message} (key ${details.key ?? "none"}, ${details.attempts} attempts)`, { cause: details.cause });
    this.name = "OrderpayError";
    this.kind = kind;
    this.key = details.key;
    this.attempts = details.attempts;
    this.status = details.status;
    this.problem = details.problem;
    this.resourceId = details.resourceId;
  }

  /** Whether sending the same call again (same key) later may succeed: no final answer came. */
  get resumable(): boolean {
    return (
      this.kind === "in_progress" ||
      this.kind === "transport" ||
      this.kind === "deadline" ||
      (this.kind === "api" && this.status !== undefined && (this.status >= 500 || this.status === 429))
    );
  }
}
