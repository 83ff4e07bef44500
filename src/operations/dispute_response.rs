//! The merchant's answers to a dispute as provider operations: evidence submitted, or the dispute
//! accepted.
//!
//! What became of an answer is what became of the dispute, as with a capture and its charge:
//! the provider's view of the dispute is the lookup. Evidence reached the provider when the
//! dispute holds our evidence and left `needs_response`; an accept, when the dispute closed as
//! `accepted`. A dispute still waiting for a response has not seen this one: it is re-sent (same
//! key). A dispute that moved on without it (decided, accepted elsewhere, evidence of another
//! text) refuses it: 409, with the dispute's status. The dispute that comes with the answer is
//! recorded in the settle's transaction (`disputes::record`), so the answer shows it as it is
//! after.

use chrono::{SubsecRound, Utc};
use diesel_async::{AsyncConnection, AsyncPgConnection};
use uuid::Uuid;

use super::leases::Table;
use super::{Actor, EngineError, Finding, GiveUp, Kind, Recorded};
use crate::disputes::responses::{self, DisputeResponse, ResponseKind, ResponseStatus, SettleResponse};
use crate::disputes::{Dispute, DisputeStatus, record, repository};
use crate::error::ApiError;
use crate::idempotency::StoredResponse;
use crate::ids::AccountId;
use crate::payments::GAVE_UP_CODE;
use crate::payments::representation::stored_action_answer;
use crate::provider::{
    Dispute as ProviderDispute, DisputeAnswer, DisputeResponseRequest, PaymentProvider, ProviderError,
};

/// What a dispute response ends as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResponseOutcome {
    /// The provider took it: the dispute as it is after.
    Taken(Box<ProviderDispute>),
    /// The dispute moved on without it: nothing of ours was taken.
    Refused(Box<ProviderDispute>),
    /// The reconciler gave up: the provider never received it.
    GaveUp(GiveUp),
}

/// A response with the dispute it answers (as we recorded it).
#[derive(Debug, Clone)]
pub struct Held {
    pub response: DisputeResponse,
    pub dispute: Dispute,
}

/// Dispute responses as provider operations.
pub struct DisputeResponses;

/// Whether the dispute still waits for the merchant's response.
fn waits_for_a_response(status: DisputeStatus) -> bool {
    matches!(status, DisputeStatus::NeedsResponse | DisputeStatus::WarningNeedsResponse)
}

/// What the provider's view of the dispute says about `response`.
pub(super) fn dispute_state(
    response: &DisputeResponse,
    dispute: ProviderDispute,
) -> Finding<ResponseOutcome> {
    let taken = match response.kind {
        ResponseKind::Evidence => {
            dispute.submission_count > 0
                && dispute.evidence.is_some()
                && dispute.evidence == response.evidence
                && !waits_for_a_response(dispute.status)
        }
        ResponseKind::Accept => dispute.closed_reason == Some(crate::disputes::ClosedReason::Accepted),
    };
    // Lost without evidence, by a provider that does not say who closed it (Stripe): our accept
    // or a lapse. Only the close itself, sent again with its key, tells: the provider replays
    // the close it took, or refuses one of a dispute already closed.
    let accepted_or_lapsed = response.kind == ResponseKind::Accept
        && dispute.closed_reason_inferred
        && dispute.status == DisputeStatus::Lost
        && dispute.submission_count == 0;
    if taken {
        Finding::Final(ResponseOutcome::Taken(Box::new(dispute)))
    } else if waits_for_a_response(dispute.status) || accepted_or_lapsed {
        // Not taken (yet): re-sent with its key.
        Finding::NotReceived
    } else {
        Finding::Final(ResponseOutcome::Refused(Box::new(dispute)))
    }
}

/// The provider's view of `held`'s dispute, or what its absence or a failed read means.
async fn provider_view(
    provider: &dyn PaymentProvider,
    held: &Held,
    request_id: Option<&str>,
) -> Result<ProviderDispute, Finding<ResponseOutcome>> {
    let id = held.dispute.provider_dispute_id.as_str();
    match provider.get_dispute(id, request_id).await {
        Ok(Some(dispute)) => Ok(dispute),
        Ok(None) => Err(Finding::Unknown { reason: format!("the provider does not know dispute {id}") }),
        Err(error) => Err(Finding::of_error(&error)),
    }
}

/// What the dispute is after the provider refused `held`'s response: as [`dispute_state`] says,
/// except that an accept refused is refused, even where a lookup cannot say who closed the
/// dispute (re-sending it would only be refused again).
async fn after_a_refusal(
    provider: &dyn PaymentProvider,
    held: &Held,
    request_id: Option<&str>,
) -> Finding<ResponseOutcome> {
    let dispute = match provider_view(provider, held, request_id).await {
        Ok(dispute) => dispute,
        Err(finding) => return finding,
    };
    match dispute_state(&held.response, dispute.clone()) {
        Finding::NotReceived if held.response.kind == ResponseKind::Accept && dispute.status.is_final() => {
            Finding::Final(ResponseOutcome::Refused(Box::new(dispute)))
        }
        found => found,
    }
}

impl Kind for DisputeResponses {
    const TABLE: Table = Table::DisputeResponses;
    type Op = Held;
    type Final = ResponseOutcome;

    fn id(held: &Held) -> (AccountId, Uuid) {
        (held.response.account_id, held.response.id)
    }

    #[cfg(any(test, feature = "test-hooks"))]
    fn statements() -> Vec<crate::db::statement::Declared> {
        use crate::db::statement::declared;
        vec![
            declared::<crate::disputes::responses::StartResponse<'static>>(),
            declared::<crate::disputes::responses::SettleResponse<'static>>(),
        ]
    }

    async fn load(
        conn: &mut AsyncPgConnection,
        (account_id, id): (AccountId, Uuid),
    ) -> diesel::QueryResult<Option<Held>> {
        let Some(response) = responses::find(conn, account_id, id).await? else {
            return Ok(None);
        };
        let dispute = repository::find(conn, account_id, response.dispute_id).await?;
        Ok(dispute.map(|dispute| Held { response, dispute }))
    }

    async fn send(
        provider: &dyn PaymentProvider,
        held: &Held,
        request_id: Option<&str>,
    ) -> Finding<ResponseOutcome> {
        let answer = match (held.response.kind, &held.response.evidence) {
            (ResponseKind::Evidence, Some(evidence)) => DisputeAnswer::Evidence(evidence.clone()),
            (ResponseKind::Accept, _) => DisputeAnswer::Accept,
            (ResponseKind::Evidence, None) => {
                return Finding::Unknown { reason: "an evidence response without evidence".into() };
            }
        };
        let request = DisputeResponseRequest {
            dispute_id: held.dispute.provider_dispute_id.clone(),
            downstream_key: held.response.downstream_key(),
            answer,
            request_id: request_id.map(str::to_owned),
        };
        match provider.respond_to_dispute(&request).await {
            Ok(dispute) => match dispute_state(&held.response, dispute) {
                Finding::NotReceived => {
                    Finding::Unknown { reason: "the provider answered but the dispute still waits".into() }
                }
                found => found,
            },
            // The dispute moved on without this response: what it is now is the answer. (An
            // accept refused is refused, whatever the dispute's close reads as.)
            Err(ProviderError::Refused { .. }) => after_a_refusal(provider, held, request_id).await,
            Err(error) => Finding::of_error(&error),
        }
    }

    async fn look_up(
        provider: &dyn PaymentProvider,
        held: &Held,
        request_id: Option<&str>,
    ) -> Finding<ResponseOutcome> {
        match provider_view(provider, held, request_id).await {
            Ok(dispute) => dispute_state(&held.response, dispute),
            Err(finding) => finding,
        }
    }

    fn gave_up(_: &Held, give_up: GiveUp) -> ResponseOutcome {
        ResponseOutcome::GaveUp(give_up)
    }

    async fn settle_on(
        conn: &mut AsyncPgConnection,
        held: &Held,
        outcome: ResponseOutcome,
        actor: Actor,
    ) -> Result<Option<Recorded>, EngineError> {
        conn.transaction(async |conn| settle_in(conn, held, outcome, actor).await).await
    }

    fn stored_answer(_: Uuid, status: u16, body: Vec<u8>) -> StoredResponse {
        stored_action_answer(status, body)
    }

    fn pending_answer(held: &Held) -> StoredResponse {
        let body = crate::disputes::representation::dispute_json(&held.dispute).unwrap_or_default();
        StoredResponse::json(202, body)
    }
}

/// Records a response's outcome in the caller's transaction: the provider's dispute first
/// (`disputes::record`, under its payment's lock), then the response with its final answer, the
/// dispute as recorded after (`settle_response.sql`).
async fn settle_in(
    conn: &mut AsyncPgConnection,
    held: &Held,
    outcome: ResponseOutcome,
    actor: Actor,
) -> Result<Option<Recorded>, EngineError> {
    let now = Utc::now().trunc_subsecs(6);
    let response = &held.response;
    if let ResponseOutcome::Taken(dispute) | ResponseOutcome::Refused(dispute) = &outcome {
        record::record_on(conn, dispute, "response").await?;
    }
    let dispute = repository::find(conn, response.account_id, response.dispute_id)
        .await?
        .ok_or_else(|| EngineError::Vanished(format!("dispute {}", response.dispute_id)))?;
    let (status, failure, quiet, answer) = match &outcome {
        ResponseOutcome::Taken(_) => {
            let body = crate::disputes::representation::dispute_json(&dispute)
                .map_err(|error| EngineError::Inconsistent(error.to_string()))?;
            (ResponseStatus::Succeeded, None, None, StoredResponse::json(200, body))
        }
        ResponseOutcome::Refused(provider) => {
            let refusal = ApiError::InvalidState {
                resource: "dispute",
                id: dispute.id,
                current: provider.status.to_string(),
                action: "answered",
            };
            let failure = ("dispute_moved_on".to_owned(), refusal.to_string());
            (ResponseStatus::Failed, Some(failure), None, refusal.to_stored_response())
        }
        ResponseOutcome::GaveUp(give_up) => {
            let message = format!(
                "the provider never received the {} after {} attempts; nothing was sent",
                response.kind, give_up.attempts
            );
            let failed = ApiError::OperationFailed {
                operation: "dispute response",
                id: response.id,
                reason: message.clone(),
            };
            let failure = (GAVE_UP_CODE.to_owned(), message);
            (ResponseStatus::Failed, Some(failure), Some(give_up.quiet), failed.to_stored_response())
        }
    };
    let statement = SettleResponse {
        account_id: response.account_id,
        id: response.id,
        status,
        failure_code: failure.as_ref().map(|(code, _)| code.as_str()),
        failure_message: failure.as_ref().map(|(_, message)| message.as_str()),
        now,
        answer_status: answer.status as i16,
        answer_body: &answer.body,
        quiet_since: quiet.map(|quiet| quiet.since),
        quiet_lease: quiet.map(|quiet| quiet.lease),
    };
    if responses::settle(conn, statement).await? == 1 {
        tracing::info!(response_id = %response.id, dispute_id = %response.dispute_id, kind = %response.kind,
            %status, actor = actor.as_str(), "dispute response settled");
        return Ok(Some(Recorded { answer, applied: true }));
    }
    // Someone settled it first: theirs is the answer. Or a give-up was held back.
    let id = (response.account_id, response.id);
    let standing = super::leases::standing(conn, Table::DisputeResponses, id)
        .await?
        .ok_or_else(|| EngineError::Vanished(format!("dispute response {}", response.id)))?;
    Ok(standing
        .answer()
        .map(|(status, body)| Recorded { answer: stored_action_answer(status, body), applied: false }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::disputes::ClosedReason;
    use rust_decimal::Decimal;

    fn response(kind: ResponseKind, evidence: Option<&str>) -> DisputeResponse {
        DisputeResponse {
            account_id: AccountId::generate(),
            id: Uuid::now_v7(),
            dispute_id: Uuid::now_v7(),
            kind,
            status: ResponseStatus::Processing,
            evidence: evidence.map(str::to_owned),
            failure_code: None,
            failure_message: None,
            idempotency_key: Some("k".into()),
            attempts: 0,
            created_at: Utc::now(),
        }
    }

    fn dispute(
        status: DisputeStatus,
        closed: Option<ClosedReason>,
        evidence: Option<&str>,
    ) -> ProviderDispute {
        ProviderDispute {
            id: "dp_1".into(),
            charge_id: "ch_1".into(),
            amount: Decimal::TEN,
            currency: "USD".into(),
            reason: "fraudulent".into(),
            status,
            closed_reason: closed,
            closed_reason_inferred: false,
            evidence_due_by: None,
            evidence: evidence.map(str::to_owned),
            submission_count: u32::from(evidence.is_some()),
            amount_withdrawn: Decimal::TEN,
            amount_reinstated: Decimal::ZERO,
            created_at: Utc::now(),
        }
    }

    fn kind_of(finding: Finding<ResponseOutcome>) -> &'static str {
        match finding {
            Finding::Final(ResponseOutcome::Taken(_)) => "taken",
            Finding::Final(ResponseOutcome::Refused(_)) => "refused",
            Finding::Final(ResponseOutcome::GaveUp(_)) => "gave up",
            Finding::NotReceived => "not received",
            Finding::Unknown { .. } => "unknown",
            Finding::Unsent { .. } => "unsent",
            Finding::KeyConflict { .. } => "key conflict",
        }
    }

    #[test]
    fn evidence_is_taken_only_when_the_dispute_holds_ours_and_moved_on() {
        let ours = response(ResponseKind::Evidence, Some("tracking 1Z"));
        let cases = [
            (dispute(DisputeStatus::NeedsResponse, None, None), "not received"),
            (dispute(DisputeStatus::UnderReview, None, Some("tracking 1Z")), "taken"),
            (dispute(DisputeStatus::Won, Some(ClosedReason::Decided), Some("tracking 1Z")), "taken"),
            // Someone else's evidence went in: ours was not taken.
            (dispute(DisputeStatus::UnderReview, None, Some("other")), "refused"),
            (dispute(DisputeStatus::Lost, Some(ClosedReason::EvidenceNotSubmitted), None), "refused"),
            // A draft of our text, not submitted, and the dispute still waits: send it.
            (
                ProviderDispute {
                    submission_count: 0,
                    ..dispute(DisputeStatus::NeedsResponse, None, Some("tracking 1Z"))
                },
                "not received",
            ),
        ];
        for (provider, expected) in cases {
            let status = provider.status;
            assert_eq!(kind_of(dispute_state(&ours, provider)), expected, "{status}");
        }
    }

    #[test]
    fn an_accept_is_taken_only_when_the_dispute_closed_as_accepted() {
        let ours = response(ResponseKind::Accept, None);
        let cases = [
            (dispute(DisputeStatus::NeedsResponse, None, None), "not received"),
            (dispute(DisputeStatus::WarningNeedsResponse, None, None), "not received"),
            (dispute(DisputeStatus::Lost, Some(ClosedReason::Accepted), None), "taken"),
            (dispute(DisputeStatus::WarningClosed, Some(ClosedReason::Accepted), None), "taken"),
            (dispute(DisputeStatus::Lost, Some(ClosedReason::Decided), None), "refused"),
            (dispute(DisputeStatus::UnderReview, None, Some("x")), "refused"),
            (dispute(DisputeStatus::Lost, Some(ClosedReason::EvidenceNotSubmitted), None), "refused"),
            // Where the provider does not say why it closed (Stripe), lost without evidence may
            // be our accept: the close is sent again with its key, whose answer tells.
            (
                ProviderDispute {
                    closed_reason_inferred: true,
                    ..dispute(DisputeStatus::Lost, Some(ClosedReason::EvidenceNotSubmitted), None)
                },
                "not received",
            ),
        ];
        for (provider, expected) in cases {
            let status = provider.status;
            assert_eq!(kind_of(dispute_state(&ours, provider)), expected, "{status}");
        }
    }
}
