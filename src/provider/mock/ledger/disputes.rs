//! The mock's disputes: opened on a captured charge (by `POST /_admin/disputes`, or on their own
//! for a `pm_card_disputed` charge once `settle_after` has passed), answered by the merchant
//! (`POST /v1/disputes/{id}`: evidence, submitted or not; `POST /v1/disputes/{id}/close`: accepted),
//! and decided by the bank (`POST /_admin/disputes/{id}/decide`). Each step emits its
//! `charge.dispute.*` event. A chargeback withdraws the disputed funds when it opens (they no
//! longer count as refundable) and a won one reinstates them, each a settlement record
//! (`dispute`, `dispute_reversal`) keyed by the disputed charge's idempotency key; an inquiry
//! (`warning_*`) moves no money.

use actix_web::http::StatusCode;
use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use serde::Deserialize;

use super::charges::ChargeState;
use super::keys::{OperationRequest, Outcome};
use super::reply::{Reply, refusal};
use super::timers::Due;
use super::{Ledger, money, new_id, positive_amount};
use crate::clock;
use crate::provider::wire::{
    DisputeBody, ListBody, UpdateDisputeBody, dispute_closed_reason as closed, dispute_status as status,
    event_type, reporting_category,
};

/// How long evidence is taken by default, as at most card networks.
const EVIDENCE_WINDOW: chrono::Duration = chrono::Duration::days(7);

pub(super) struct StoredDispute {
    pub(super) id: String,
    pub(super) charge: usize,
    pub(super) amount: Decimal,
    pub(super) reason: String,
    /// One of `dispute_status`.
    pub(super) status: &'static str,
    pub(super) closed_reason: Option<&'static str>,
    pub(super) evidence_due_by: DateTime<Utc>,
    pub(super) evidence: Option<String>,
    pub(super) submission_count: u32,
    pub(super) withdrawn: Decimal,
    pub(super) reinstated: Decimal,
    pub(super) created_at: DateTime<Utc>,
}

/// `POST /_admin/disputes` body.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpenDispute {
    /// The charge's id.
    pub charge: String,
    pub reason: String,
    /// Absent: all that is still disputable (captured, less refunded, less disputed).
    #[serde(default)]
    pub amount: Option<String>,
    /// An inquiry (`warning_needs_response`): no funds are withdrawn.
    #[serde(default)]
    pub inquiry: bool,
    /// Evidence is taken for this long (default 7 days).
    #[serde(default)]
    pub evidence_due_in_secs: Option<u32>,
}

/// `POST /_admin/disputes/{id}/decide` body.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Decision {
    /// `won` or `lost`.
    pub outcome: String,
}

fn conflict(code: &str, message: &str) -> Reply {
    refusal(StatusCode::CONFLICT, "invalid_request", code, message)
}

impl Ledger {
    pub(super) fn dispute_body(&self, index: usize) -> DisputeBody {
        let dispute = &self.disputes[index];
        let currency = self.charges[dispute.charge].currency;
        DisputeBody {
            id: dispute.id.clone(),
            object: "dispute".to_owned(),
            charge: self.charges[dispute.charge].id.clone(),
            amount: money(dispute.amount, currency),
            currency: currency.code().to_owned(),
            reason: dispute.reason.clone(),
            status: dispute.status.to_owned(),
            closed_reason: dispute.closed_reason.map(str::to_owned),
            evidence_due_by: (!matches!(dispute.status, status::WON | status::LOST | status::WARNING_CLOSED))
                .then_some(dispute.evidence_due_by),
            evidence: dispute.evidence.clone(),
            submission_count: dispute.submission_count,
            amount_withdrawn: money(dispute.withdrawn, currency),
            amount_reinstated: money(dispute.reinstated, currency),
            created_at: dispute.created_at,
        }
    }

    pub fn dispute_by_id(&self, id: &str) -> Option<DisputeBody> {
        self.dispute_by_id.get(id).map(|&index| self.dispute_body(index))
    }

    /// `GET /v1/disputes`: newest first, created at or after `created_gte` (Unix seconds), after
    /// the dispute `starting_after`; with whether there are more.
    pub fn list_disputes(
        &self,
        created_gte: Option<i64>,
        limit: usize,
        starting_after: Option<&str>,
    ) -> Reply {
        let newest_first = (0..self.disputes.len()).rev().filter(|&index| {
            created_gte.is_none_or(|gte| self.disputes[index].created_at.timestamp() >= gte)
        });
        let mut page: Vec<usize> = match starting_after {
            Some(id) => {
                let Some(&after) = self.dispute_by_id.get(id) else {
                    return Reply::missing("dispute");
                };
                newest_first.skip_while(|&index| index >= after).take(limit + 1).collect()
            }
            None => newest_first.take(limit + 1).collect(),
        };
        let has_more = page.len() > limit;
        page.truncate(limit);
        let data = page.into_iter().map(|index| self.dispute_body(index)).collect();
        Reply::new(StatusCode::OK, ListBody { object: "list".to_owned(), data, has_more }, false)
    }

    /// A captured `pm_card_disputed` charge is disputed on its own once `settle_after` passed.
    pub(super) fn dispute_later(&mut self, charge: usize, now: DateTime<Utc>) {
        if self.charges[charge].request.payment_method == "pm_card_disputed" {
            let at = clock::after(now, self.timing.settle_after);
            self.charges[charge].disputes_at = Some(at);
            self.schedule(at, Due::Charge(charge));
        }
    }

    /// Opens the dispute a `pm_card_disputed` charge has due by `now` (once).
    pub(super) fn open_due_dispute(&mut self, charge: usize, now: DateTime<Utc>) {
        if self.charges[charge].disputes_at.is_some_and(|at| at <= now) {
            self.charges[charge].disputes_at = None;
            let request = OpenDispute {
                charge: self.charges[charge].id.clone(),
                reason: "fraudulent".to_owned(),
                amount: None,
                inquiry: false,
                evidence_due_in_secs: None,
            };
            let reply = self.open_dispute(request, now);
            if !reply.status.is_success() {
                tracing::info!(charge = %self.charges[charge].id, answer = ?reply.body,
                    "mock provider: the due dispute could not open");
            }
        }
    }

    /// `POST /_admin/disputes`: the customer's bank disputes a captured charge.
    pub fn open_dispute(&mut self, request: OpenDispute, now: DateTime<Utc>) -> Reply {
        let Some(&charge_index) = self.charge_by_id.get(&request.charge) else {
            return Reply::missing("charge");
        };
        self.advance_charge(charge_index, now);
        let charge = &self.charges[charge_index];
        if charge.state != ChargeState::Succeeded {
            return conflict("charge_not_disputable", "only a captured charge can be disputed");
        }
        let disputable = charge.amount_captured - charge.amount_refunded - charge.amount_disputed;
        let amount = match request.amount.as_deref().map(|text| positive_amount(text, charge.currency)) {
            None if disputable > Decimal::ZERO => disputable,
            None => return conflict("charge_not_disputable", "nothing left to dispute"),
            Some(Ok(amount)) if amount <= disputable => amount,
            Some(Ok(_)) => return Reply::invalid("the dispute exceeds what was captured and not refunded"),
            Some(Err(reply)) => return reply,
        };
        let window = request
            .evidence_due_in_secs
            .map_or(EVIDENCE_WINDOW, |secs| chrono::Duration::seconds(i64::from(secs)));
        let index = self.disputes.len();
        let dispute = StoredDispute {
            id: new_id("dp"),
            charge: charge_index,
            amount,
            reason: request.reason,
            status: if request.inquiry { status::WARNING_NEEDS_RESPONSE } else { status::NEEDS_RESPONSE },
            closed_reason: None,
            evidence_due_by: now + window,
            evidence: None,
            submission_count: 0,
            withdrawn: if request.inquiry { Decimal::ZERO } else { amount },
            reinstated: Decimal::ZERO,
            created_at: now,
        };
        self.charges[charge_index].amount_disputed += dispute.withdrawn;
        self.dispute_by_id.insert(dispute.id.clone(), index);
        let withdrawn = dispute.withdrawn > Decimal::ZERO;
        self.disputes.push(dispute);
        self.emit_dispute(event_type::DISPUTE_CREATED, index);
        if withdrawn {
            self.record_dispute_movement(reporting_category::DISPUTE, index, now);
            self.emit_dispute(event_type::DISPUTE_FUNDS_WITHDRAWN, index);
        }
        Reply::new(StatusCode::CREATED, self.dispute_body(index), false)
    }

    /// `POST /_admin/disputes/{id}/decide`: the bank decides, `won` (the funds come back) or
    /// `lost`; an inquiry just closes.
    pub fn decide_dispute(&mut self, id: &str, decision: &Decision, now: DateTime<Utc>) -> Reply {
        let Some(&index) = self.dispute_by_id.get(id) else {
            return Reply::missing("dispute");
        };
        let won = match decision.outcome.as_str() {
            "won" => true,
            "lost" => false,
            _ => return Reply::invalid("outcome must be won or lost"),
        };
        let dispute = &mut self.disputes[index];
        let submitted = dispute.submission_count > 0;
        dispute.status = match dispute.status {
            status::WARNING_NEEDS_RESPONSE | status::WARNING_UNDER_REVIEW => status::WARNING_CLOSED,
            status::NEEDS_RESPONSE | status::UNDER_REVIEW if won => status::WON,
            status::NEEDS_RESPONSE | status::UNDER_REVIEW => status::LOST,
            _ => return conflict("dispute_closed", "the dispute is closed"),
        };
        dispute.closed_reason =
            Some(if submitted || won { closed::DECIDED } else { closed::EVIDENCE_NOT_SUBMITTED });
        let reinstated = if dispute.status == status::WON { dispute.withdrawn } else { Decimal::ZERO };
        dispute.reinstated += reinstated;
        let charge = dispute.charge;
        self.charges[charge].amount_disputed -= reinstated;
        if reinstated > Decimal::ZERO {
            self.record_dispute_movement(reporting_category::DISPUTE_REVERSAL, index, now);
            self.emit_dispute(event_type::DISPUTE_FUNDS_REINSTATED, index);
        }
        self.emit_dispute(event_type::DISPUTE_CLOSED, index);
        Reply::new(StatusCode::OK, self.dispute_body(index), false)
    }

    /// The settlement record of a dispute's funds leaving (`dispute`) or coming back
    /// (`dispute_reversal`), named by the disputed charge's key.
    fn record_dispute_movement(&mut self, category: &str, index: usize, at: DateTime<Utc>) {
        let dispute = &self.disputes[index];
        let charge = &self.charges[dispute.charge];
        let amount =
            if category == reporting_category::DISPUTE { -dispute.withdrawn } else { dispute.reinstated };
        let (currency, id, key) = (charge.currency, dispute.id.clone(), charge.key.clone());
        self.record_movement(category, amount, currency, &id, &key, at);
    }

    /// `POST /v1/disputes/{id}`: the merchant's evidence, submitted (the dispute goes under
    /// review) or kept as a draft. Only while the dispute needs a response.
    pub fn update_dispute(
        &mut self,
        id: &str,
        key: &str,
        body: UpdateDisputeBody,
        now: DateTime<Utc>,
        hold_fault: bool,
    ) -> Reply {
        let request = OperationRequest::UpdateDispute { dispute: id.to_owned(), body: body.clone() };
        if let Some(reply) = self.replay(key, &request, now) {
            return reply;
        }
        let Some(&index) = self.dispute_by_id.get(id) else {
            return Reply::missing("dispute");
        };
        let dispute = &mut self.disputes[index];
        let next = match (dispute.status, body.submit) {
            (status::WARNING_NEEDS_RESPONSE, true) => status::WARNING_UNDER_REVIEW,
            (status::NEEDS_RESPONSE, true) => status::UNDER_REVIEW,
            (open @ (status::WARNING_NEEDS_RESPONSE | status::NEEDS_RESPONSE), false) => open,
            _ => {
                let reply =
                    conflict("dispute_not_updatable", "evidence is taken only while a response is needed");
                return self.refuse(key, request, reply);
            }
        };
        if let Some(evidence) = body.evidence {
            dispute.evidence = Some(evidence);
        }
        dispute.submission_count += u32::from(body.submit);
        dispute.status = next;
        self.record(key, request, Outcome::Dispute(index));
        self.emit_dispute(event_type::DISPUTE_UPDATED, index);
        Reply::new(StatusCode::OK, self.dispute_body(index), hold_fault)
    }

    /// `POST /v1/disputes/{id}/close`: the merchant accepts the dispute (lost; an inquiry closes).
    pub fn close_dispute(&mut self, id: &str, key: &str, now: DateTime<Utc>, hold_fault: bool) -> Reply {
        let request = OperationRequest::CloseDispute { dispute: id.to_owned() };
        if let Some(reply) = self.replay(key, &request, now) {
            return reply;
        }
        let Some(&index) = self.dispute_by_id.get(id) else {
            return Reply::missing("dispute");
        };
        let dispute = &mut self.disputes[index];
        dispute.status = match dispute.status {
            status::WARNING_NEEDS_RESPONSE | status::WARNING_UNDER_REVIEW => status::WARNING_CLOSED,
            status::NEEDS_RESPONSE => status::LOST,
            _ => {
                let reply =
                    conflict("dispute_not_closable", "only a dispute that needs a response can be accepted");
                return self.refuse(key, request, reply);
            }
        };
        dispute.closed_reason = Some(closed::ACCEPTED);
        self.record(key, request, Outcome::Dispute(index));
        self.emit_dispute(event_type::DISPUTE_CLOSED, index);
        Reply::new(StatusCode::OK, self.dispute_body(index), hold_fault)
    }
}
