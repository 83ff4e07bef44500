//! Answering a dispute: `POST /disputes/{id}/evidence` and `POST /disputes/{id}/accept`, each a
//! keyed request that starts one provider operation (`operations::dispute_response`) through
//! the engine's request flow.

use diesel_async::AsyncPgConnection;
use uuid::Uuid;

use super::repository;
use super::responses::{self, DisputeResponse, ResponseKind, ResponseStatus, StartOutcome, StartResponse};
use crate::error::ApiError;
use crate::idempotency::{KeyedRequest, Keys};
use crate::operations::Engine;
use crate::operations::dispute_response::{DisputeResponses, Held};
use crate::operations::request::{self, Answer, Round, Start, StartError, Started};

/// An answer to a dispute, as the request asked it.
#[derive(Debug, Clone)]
pub struct RespondCommand {
    pub dispute_id: Uuid,
    pub kind: ResponseKind,
    /// The evidence (an `Evidence` answer only).
    pub evidence: Option<String>,
}

/// `POST /disputes/{id}/evidence` and `POST /disputes/{id}/accept`.
pub async fn respond(
    engine: &Engine,
    keys: &Keys,
    keyed: &KeyedRequest,
    command: &RespondCommand,
    request_id: &str,
) -> Result<Answer, ApiError> {
    request::run(engine, keys, keyed, &RespondStart { keyed, command }, request_id).await
}

/// The start of a dispute response: `start_response.sql`, claiming the key with it.
struct RespondStart<'a> {
    keyed: &'a KeyedRequest,
    command: &'a RespondCommand,
}

impl Start for RespondStart<'_> {
    type Kind = DisputeResponses;

    async fn run(
        &self,
        conn: &mut AsyncPgConnection,
        round: Round<'_>,
    ) -> Result<Started<DisputeResponses>, StartError> {
        let (keyed, command) = (self.keyed, self.command);
        let account_id = keyed.account_id;
        let statement = StartResponse {
            claim: round.claim,
            dispute_id: command.dispute_id,
            kind: command.kind,
            evidence: command.evidence.as_deref(),
            lease_until: round.lease.until,
            lease_id: round.lease.id,
        };
        let (outcome, status, due_by, in_flight) = responses::start(conn, statement).await?;
        let dispute_id = command.dispute_id;
        Ok(match outcome {
            StartOutcome::Started => {
                let Some(dispute) = repository::find(conn, account_id, dispute_id).await? else {
                    let error = anyhow::anyhow!("a started {} lost its dispute", command.kind);
                    return Err(ApiError::Internal(error).into());
                };
                let response = DisputeResponse {
                    account_id,
                    id: round.id,
                    dispute_id,
                    kind: command.kind,
                    status: ResponseStatus::Processing,
                    evidence: command.evidence.clone(),
                    failure_code: None,
                    failure_message: None,
                    idempotency_key: Some(keyed.key.as_str().to_owned()),
                    attempts: 0,
                    created_at: round.now,
                };
                Started::Drive(Held { response, dispute })
            }
            StartOutcome::KeyExists => Started::ExistingKey,
            StartOutcome::DisputeNotFound => {
                Started::Refuse(ApiError::NotFound { resource: "dispute", id: dispute_id.to_string() })
            }
            // A dispute never goes back to needing a response, nor evidence back before its due
            // date: both are final answers, stored with the key.
            StartOutcome::InvalidState => Started::Answer(
                ApiError::InvalidState {
                    resource: "dispute",
                    id: dispute_id,
                    current: status.map_or_else(|| "unknown".to_owned(), |status| status.to_string()),
                    action: "answered",
                }
                .to_stored_response(),
            ),
            StartOutcome::PastDue => match due_by {
                Some(due_by) => {
                    Started::Answer(ApiError::EvidencePastDue { dispute_id, due_by }.to_stored_response())
                }
                None => return Err(ApiError::Internal(anyhow::anyhow!("past due without a due date")).into()),
            },
            StartOutcome::InFlight => Started::Refuse(ApiError::DisputeResponseInProgress {
                dispute_id,
                response_id: in_flight.unwrap_or_default(),
            }),
            StartOutcome::Changed => Started::Again,
        })
    }
}
