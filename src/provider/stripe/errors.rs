//! Stripe's error answers sorted into what they mean for an operation in flight
//! (docs/providers.md, "Errors"). Stripe answers an error with an HTTP status, a
//! `Stripe-Should-Retry` header when it knows better than the status, and
//! `{"error": {"type", "code", "decline_code", "message"}}`.
//!
//! [`StripeFailure`] is this module's own; [`StripeFailure::into_provider_error`] folds it into
//! the engine's `ProviderError` (a misconfigured credential into `Unauthorized`, a reused key
//! into `Rejected`: our side to fix, never an answer about the money).

use serde::Deserialize;

use crate::payments::representation::AUTHORIZATION_EXPIRED;
use crate::provider::ProviderError;

/// What a Stripe error answer means for the call that got it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StripeFailure {
    /// The card was declined: nothing was charged, a definite answer. `code` is Stripe's
    /// `decline_code` (`insufficient_funds`, ...), or its `code` when it gives none.
    Declined { code: String, message: String },
    /// Stripe may or may not have acted (409, 429, 5xx, or `Stripe-Should-Retry: true`): the
    /// outcome is unknown until the same call, with the same Idempotency-Key, or a lookup tells.
    /// `retry` is false only when Stripe said `Stripe-Should-Retry: false`: then only a lookup
    /// will tell.
    Unknown { status: u16, message: String, retry: bool },
    /// Our API key is wrong, revoked or lacks a permission (`authentication_error`,
    /// `permission_error`, 401, 403): no call succeeds until an operator fixes the settings.
    Misconfigured { status: u16, message: String },
    /// The Idempotency-Key was used before with other parameters (`idempotency_error`): our bug,
    /// since one key always carries one request.
    Bug { status: u16, message: String },
    /// Any other refusal (`invalid_request_error`, ...): Stripe did not act on this request.
    Rejected { status: u16, code: Option<String>, message: String },
}

#[derive(Debug, Default, Deserialize)]
struct ErrorEnvelope {
    error: ErrorObject,
}

#[derive(Debug, Default, Deserialize)]
struct ErrorObject {
    #[serde(rename = "type")]
    kind: Option<String>,
    code: Option<String>,
    decline_code: Option<String>,
    message: Option<String>,
}

/// Sorts an error answer: its HTTP `status`, its `Stripe-Should-Retry` header if any, and its
/// body (which may be anything: a proxy's HTML page is an answer too).
pub fn classify(status: u16, should_retry: Option<&str>, body: &[u8]) -> StripeFailure {
    let error =
        serde_json::from_slice::<ErrorEnvelope>(body).map(|envelope| envelope.error).unwrap_or_default();
    let message = error.message.clone().unwrap_or_else(|| format!("HTTP {status} without a Stripe error"));
    let kind = error.kind.as_deref();
    let code = error.code.as_deref();
    let should_retry =
        should_retry.map(str::trim).and_then(|value| match value.to_ascii_lowercase().as_str() {
            "true" => Some(true),
            "false" => Some(false),
            _ => None,
        });
    // A 402 card_declined is a decline whatever its type says; any card_error is one too.
    if (status == 402 && code == Some("card_declined")) || kind == Some("card_error") {
        let code = error.decline_code.or(error.code).unwrap_or_else(|| "card_declined".to_owned());
        return StripeFailure::Declined { code, message };
    }
    // A request with our key still running at Stripe: the same call later gets its answer.
    if should_retry == Some(true) || code == Some("idempotency_key_in_use") {
        return StripeFailure::Unknown { status, message, retry: true };
    }
    if matches!(kind, Some("authentication_error" | "permission_error")) || matches!(status, 401 | 403) {
        return StripeFailure::Misconfigured { status, message };
    }
    if kind == Some("idempotency_error") {
        return StripeFailure::Bug { status, message };
    }
    if matches!(status, 409 | 429) || status >= 500 {
        return StripeFailure::Unknown { status, message, retry: should_retry != Some(false) };
    }
    StripeFailure::Rejected { status, code: error.code, message }
}

/// The `code`s of an `invalid_request_error` that refuse a capture, cancel or refund for good:
/// nothing moved, and re-sending will not change the answer.
const REFUSAL_CODES: &[&str] = &[
    "amount_too_large",
    "amount_too_small",
    "charge_already_captured",
    "charge_already_refunded",
    "charge_disputed",
    "charge_expired_for_capture",
    "charge_not_refundable",
    "payment_intent_unexpected_state",
];

impl StripeFailure {
    /// What the engine sees of a failed capture, cancel, refund or lookup. A decline or a known
    /// refusal is `Refused` (Stripe's expired authorization under our `authorization_expired`); an
    /// unknown outcome is `ServerError` (retried, or settled by a lookup); a misconfigured key is
    /// `Unauthorized` (Stripe did not act); a reused Idempotency-Key and any other refusal are
    /// `Rejected`. Both of our own making are counted in `orderpay_provider_errors_total`.
    pub fn into_provider_error(self) -> ProviderError {
        match self {
            StripeFailure::Declined { code, message } => ProviderError::Refused { code, message },
            StripeFailure::Unknown { status, .. } => ProviderError::ServerError(status),
            StripeFailure::Misconfigured { status, message } => {
                crate::telemetry::metrics::provider_error("auth");
                ProviderError::Unauthorized {
                    status,
                    message: format!(
                        "Stripe refused the API key (check ORDERPAY_PROVIDER_API_KEY): {message}"
                    ),
                }
            }
            StripeFailure::Bug { status, message } => {
                crate::telemetry::metrics::provider_error("idempotency");
                ProviderError::KeyReused { status, message }
            }
            StripeFailure::Rejected { code: Some(code), message, .. }
                if REFUSAL_CODES.contains(&code.as_str()) =>
            {
                let code = if code == "charge_expired_for_capture" {
                    AUTHORIZATION_EXPIRED.to_owned()
                } else {
                    code
                };
                ProviderError::Refused { code, message }
            }
            StripeFailure::Rejected { status, code, message } => {
                let message = match code {
                    Some(code) => format!("{code}: {message}"),
                    None => message,
                };
                ProviderError::Rejected { status, message }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(kind: &str, code: Option<&str>, decline_code: Option<&str>) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "error": {"type": kind, "code": code, "decline_code": decline_code, "message": "as Stripe says"}
        }))
        .unwrap()
    }

    fn declined(code: &str) -> StripeFailure {
        StripeFailure::Declined { code: code.into(), message: "as Stripe says".into() }
    }

    #[test]
    fn card_declines_are_definite_with_the_decline_code_standing_in() {
        let insufficient = body("card_error", Some("card_declined"), Some("insufficient_funds"));
        assert_eq!(classify(402, None, &insufficient), declined("insufficient_funds"));
        // Without a decline_code, the code stands in.
        assert_eq!(
            classify(402, None, &body("card_error", Some("expired_card"), None)),
            declined("expired_card")
        );
        // A 402 card_declined is a decline whatever its type.
        let odd_type = body("invalid_request_error", Some("card_declined"), Some("do_not_honor"));
        assert_eq!(classify(402, None, &odd_type), declined("do_not_honor"));
        assert_eq!(
            classify(402, None, &body("api_error", Some("card_declined"), None)),
            declined("card_declined")
        );
    }

    #[test]
    fn conflicts_rate_limits_and_server_errors_leave_the_outcome_unknown() {
        for status in [409, 429, 500, 502, 503] {
            let answer = classify(status, None, &body("api_error", None, None));
            assert_eq!(
                answer,
                StripeFailure::Unknown { status, message: "as Stripe says".into(), retry: true }
            );
        }
        // Stripe-Should-Retry: true makes any answer retryable; false keeps a 5xx unknown but
        // says a re-send will not help.
        let locked = body("invalid_request_error", Some("lock_timeout"), None);
        assert!(matches!(classify(400, Some("true"), &locked), StripeFailure::Unknown { retry: true, .. }));
        assert!(matches!(
            classify(500, Some("false"), b""),
            StripeFailure::Unknown { status: 500, retry: false, .. }
        ));
        let in_use = body("idempotency_error", Some("idempotency_key_in_use"), None);
        assert!(matches!(classify(409, None, &in_use), StripeFailure::Unknown { retry: true, .. }));
    }

    #[test]
    fn credential_problems_are_a_misconfiguration() {
        for (status, kind) in
            [(401, "authentication_error"), (403, "permission_error"), (401, "invalid_request_error")]
        {
            assert_eq!(
                classify(status, None, &body(kind, None, None)),
                StripeFailure::Misconfigured { status, message: "as Stripe says".into() },
                "{status} {kind}"
            );
        }
    }

    #[test]
    fn a_key_reused_with_other_parameters_is_our_bug() {
        let reused = body("idempotency_error", None, None);
        assert_eq!(
            classify(400, None, &reused),
            StripeFailure::Bug { status: 400, message: "as Stripe says".into() }
        );
    }

    #[test]
    fn other_refusals_keep_their_code_and_unreadable_bodies_their_status() {
        let refused = body("invalid_request_error", Some("charge_already_refunded"), None);
        assert_eq!(
            classify(400, None, &refused),
            StripeFailure::Rejected {
                status: 400,
                code: Some("charge_already_refunded".into()),
                message: "as Stripe says".into()
            }
        );
        assert_eq!(
            classify(404, None, b"<html>not found</html>"),
            StripeFailure::Rejected {
                status: 404,
                code: None,
                message: "HTTP 404 without a Stripe error".into()
            }
        );
        assert!(matches!(
            classify(502, None, b"<html>bad gateway</html>"),
            StripeFailure::Unknown { status: 502, .. }
        ));
    }

    #[test]
    fn failures_reach_the_engine_as_refusals_unknown_outcomes_or_rejections() {
        let error =
            |status, kind, code| classify(status, None, &body(kind, code, None)).into_provider_error();
        assert_eq!(
            error(402, "card_error", Some("card_declined")),
            ProviderError::Refused { code: "card_declined".into(), message: "as Stripe says".into() }
        );
        assert_eq!(
            error(400, "invalid_request_error", Some("charge_expired_for_capture")),
            ProviderError::Refused { code: "authorization_expired".into(), message: "as Stripe says".into() }
        );
        assert!(matches!(
            error(400, "invalid_request_error", Some("charge_already_refunded")),
            ProviderError::Refused { code, .. } if code == "charge_already_refunded"
        ));
        assert_eq!(error(429, "rate_limit_error", None), ProviderError::ServerError(429));
        assert_eq!(error(503, "api_error", None), ProviderError::ServerError(503));
        let key = error(401, "authentication_error", None);
        assert!(
            matches!(&key, ProviderError::Unauthorized { status: 401, message } if message.contains("API key")),
            "{key:?}"
        );
        assert!(matches!(
            error(400, "idempotency_error", None),
            ProviderError::KeyReused { status: 400, .. }
        ));
        let unknown = error(400, "invalid_request_error", Some("parameter_unknown"));
        assert_eq!(
            unknown,
            ProviderError::Rejected { status: 400, message: "parameter_unknown: as Stripe says".into() }
        );
    }
}
