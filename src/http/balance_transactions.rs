//! `GET /balance_transactions`: the account's money movements, newest first, as the ledger
//! records them (`ledger`), in the shape of Stripe's balance transactions.

use actix_web::{HttpRequest, HttpResponse, web};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::AppState;
use super::auth::Authenticated;
use crate::error::ApiError;
use crate::ids::{OrderId, PaymentId};
use crate::ledger::{self, Filter, LedgerAccount, Movement, MovementType};
use crate::money::Amount;

/// `GET /balance_transactions` query.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    payment_id: Option<String>,
    order_id: Option<String>,
    #[serde(rename = "type")]
    movement_type: Option<String>,
    limit: Option<String>,
    starting_after: Option<String>,
}

#[derive(Serialize)]
struct Source {
    object: &'static str,
    id: Uuid,
}

#[derive(Serialize)]
struct BalanceTransaction {
    id: Uuid,
    object: &'static str,
    #[serde(rename = "type")]
    movement_type: MovementType,
    /// What moved (always positive); `net` says which way.
    amount: Amount,
    /// What the movement did to the provider's balance: negative when money left it.
    net: String,
    currency: &'static str,
    debit: LedgerAccount,
    credit: LedgerAccount,
    source: Source,
    payment_id: PaymentId,
    order_id: OrderId,
    created_at: DateTime<Utc>,
}

impl BalanceTransaction {
    fn from(movement: &Movement) -> Result<Self, ApiError> {
        let amount = Amount::from_decimal(movement.amount, movement.currency).map_err(|error| {
            ApiError::Internal(anyhow::anyhow!("ledger movement {}: {error}", movement.id))
        })?;
        let (object, id) = movement.source();
        Ok(BalanceTransaction {
            id: movement.id,
            object: "balance_transaction",
            movement_type: movement.movement_type,
            amount,
            net: movement.net().to_string(),
            currency: movement.currency.code(),
            debit: movement.debit_account,
            credit: movement.credit_account,
            source: Source { object, id },
            payment_id: movement.payment_id,
            order_id: movement.order_id,
            created_at: movement.created_at,
        })
    }
}

/// `GET /balance_transactions?payment_id=&order_id=&type=&limit=&starting_after=`
pub async fn list(
    state: web::Data<AppState>,
    Authenticated(account): Authenticated,
    request: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let query: ListQuery = super::list_query(&request)?;
    let limit = super::page_limit(query.limit.as_deref())?;
    let filter = Filter {
        payment_id: super::parameter(query.payment_id.as_deref(), PaymentId::parse, || {
            "payment_id must be a payment id".to_owned()
        })?,
        order_id: super::parameter(query.order_id.as_deref(), OrderId::parse, || {
            "order_id must be an order id".to_owned()
        })?,
        movement_type: super::parameter(query.movement_type.as_deref(), MovementType::parse, || {
            format!(
                "unknown balance transaction type {:?}",
                query.movement_type.as_deref().unwrap_or_default()
            )
        })?,
    };
    let starting_after =
        super::page_cursor(query.starting_after.as_deref(), "a balance transaction", |text| {
            Uuid::try_parse(text).ok()
        })?;
    let mut conn = state.pool.get().await?;
    let (movements, has_more) = ledger::list(&mut conn, account.id, filter, limit, starting_after).await?;
    let data = movements.iter().map(BalanceTransaction::from).collect::<Result<Vec<_>, _>>()?;
    Ok(super::page(data, has_more))
}
