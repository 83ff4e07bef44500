//! The mock's HTTP replies: an object or an error, and whether to hold it past the client's
//! timeout. Every ledger operation answers with one; the handlers only send it.

use actix_web::http::StatusCode;
use serde_json::Value;

use crate::provider::wire::{ErrorBody, ErrorDetail};

/// What the HTTP layer sends back: an object (or an error) and whether to hold the answer past
/// the client's timeout first (the operation itself has happened).
#[derive(Debug, Clone)]
pub(in crate::provider::mock) struct Reply {
    pub status: StatusCode,
    pub body: Value,
    pub hold: bool,
}

impl Reply {
    pub(super) fn new(status: StatusCode, body: impl serde::Serialize, hold: bool) -> Reply {
        // Our own wire types always serialise; `Null` would only show a bug, never panic.
        Reply { status, body: serde_json::to_value(body).unwrap_or(Value::Null), hold }
    }

    pub fn error(status: StatusCode, kind: &str, code: Option<&str>, message: &str) -> Reply {
        let error =
            ErrorDetail { kind: kind.to_owned(), code: code.map(str::to_owned), message: message.to_owned() };
        Reply::new(status, ErrorBody { error }, false)
    }

    pub(super) fn invalid(message: &str) -> Reply {
        Reply::error(StatusCode::BAD_REQUEST, "invalid_request", None, message)
    }

    pub(super) fn missing(what: &str) -> Reply {
        Reply::error(
            StatusCode::NOT_FOUND,
            "invalid_request",
            Some("resource_missing"),
            &format!("no such {what}"),
        )
    }

    pub(super) fn key_reused() -> Reply {
        Reply::error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "idempotency_error",
            None,
            "this Idempotency-Key was used with different parameters",
        )
    }
}

/// A definite refusal, stored under its idempotency key and replayed like a success.
pub(super) fn refusal(status: StatusCode, kind: &str, code: &str, message: &str) -> Reply {
    Reply::error(status, kind, Some(code), message)
}
