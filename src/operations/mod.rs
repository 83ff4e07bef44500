//! Provider operations: calls to the payment provider whose outcome we may not see, and the one
//! engine that drives them to a final state, whoever drives (docs/payments.md).
//!
//! An operation's row holds what moves while it runs: its status (`processing` while the
//! outcome is unknown), the lease of whoever drives it, when it last sent a request, and, once
//! settled, its final answer. Three kinds of driver share the same two steps:
//!
//! - [`charge::drive`]: ask the provider, by the operation's downstream key (send, or look up
//!   first and re-send only what the provider never received), and turn the answer into an
//!   [`Outcome`];
//! - [`settle`]: apply a final outcome in one statement (guarded status change, aggregates,
//!   audit row, final answer), or [`settle::release`] an unknown one for a later check.
//!
//! The drivers are the request (phase 2, after its own send), a retry that takes an abandoned
//! operation over, and the reconciler ([`reconciler`]), which claims due operations.

pub mod charge;
pub mod reconciler;
pub mod settle;

use std::sync::Arc;
use std::time::Duration;

use crate::db::{Pool, PoolRunError};
use crate::provider::PaymentProvider;

/// What every driver of provider operations needs.
#[derive(Clone)]
pub struct Engine {
    pub pool: Pool,
    pub provider: Arc<dyn PaymentProvider>,
    pub timing: Timing,
}

/// The engine's clock settings.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// How long a request owns an operation while it calls the provider; longer than the
    /// provider timeout, so a live request is never taken over.
    pub lease: Duration,
    /// When an unknown outcome left by a request is first checked again.
    pub recheck_after: Duration,
}

/// What one provider answer means for an operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The provider did it (charged).
    Succeeded { charge_id: String },
    /// The provider definitely refused; nothing moved.
    Declined { code: String, message: String },
    /// We do not know (yet): the operation stays `processing`.
    Unknown { reason: String },
    /// The provider has no record of the downstream key: it never received a request. (Only a
    /// lookup answers this; a send never does.)
    NotReceived,
}

/// The final state an operation is being moved to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settlement {
    Succeeded { charge_id: String },
    Failed { code: String, message: String },
}

crate::text_enum! {
    /// Who applied a transition, for the audit trail.
    pub enum Actor {
        Request = "request",
        Reconciler = "reconciler",
    }
}

/// How much the provider may already know about an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DriveMode {
    /// Straight after phase 1: the provider has certainly never seen it; send it.
    FirstCall,
    /// A takeover or the reconciler: look it up by its downstream key first, and re-send it
    /// (same key) only if the provider never received it.
    Redrive,
    /// Look only; never send. The reconciler's last check before giving up.
    LookupOnly,
}

/// Why the engine could not record what it learned; the operation stays as it was, for a retry
/// or the next reconciler pass.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("database: {0}")]
    Database(#[from] diesel::result::Error),
    #[error("database pool: {0}")]
    Pool(#[from] PoolRunError),
    #[error("{0} vanished")]
    Vanished(String),
}
