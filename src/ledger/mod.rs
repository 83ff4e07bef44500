//! The books: a double-entry ledger of every money movement, and its checks.
//!
//! A movement moves an amount from one ledger account to another (it debits one and credits the
//! other by the same amount, so it balances by construction, as TigerBeetle's transfers do).
//! The database writes movements itself, by triggers on the two columns that hold our money (a
//! payment's `amount_captured`, a refund's `status`: migration `ledger`; a dispute's money:
//! migration `disputes`), in the very statement
//! that settles them, so that no path that moves money can forget its movement and a settle that
//! changes nothing writes nothing. This module reads them: the `GET /balance_transactions`
//! listing ([`list`]) and `orderpay ledger check` ([`check`]). docs/books.md explains the books.

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use rust_decimal::Decimal;
use serde::Serialize;
use uuid::Uuid;

use crate::db::schema::ledger_movements;
use crate::ids::{AccountId, OrderId, PaymentId};
use crate::money::Currency;

crate::text_enum! {
    /// Why money moved (the `type` of a balance transaction). A new type needs its reason in
    /// docs/books.md and the ledger's CHECK.
    pub enum MovementType {
        /// A charge (or an authorization's capture) succeeded: the customer paid.
        ChargeCaptured = "charge_captured",
        /// A refund succeeded: money given back to the customer.
        Refund = "refund",
        /// A refund that succeeded was reversed by the provider: the money came back.
        RefundReversal = "refund_reversal",
        /// A refund recorded as failed (given up on) turned out carried out after all.
        RefundCorrection = "refund_correction",
        /// A charge landed on a payment we had told the customer failed: owed back.
        LateCharge = "late_charge",
        /// The system's refund of a late charge succeeded.
        LateChargeRefund = "late_charge_refund",
        /// The customer's bank took a disputed payment's funds back.
        DisputeWithdrawal = "dispute_withdrawal",
        /// A dispute won: the funds came back.
        DisputeReinstatement = "dispute_reinstatement",
    }
}

crate::text_enum! {
    /// The ledger's accounts, one of each per (orderpay account, currency).
    pub enum LedgerAccount {
        /// What the provider holds for the merchant (a debit adds).
        ProviderBalance = "provider_balance",
        /// What customers paid (a credit adds).
        CustomerPayments = "customer_payments",
        /// What was given back to customers (a debit adds).
        Refunds = "refunds",
        /// What customers' banks took back (a debit adds).
        Disputes = "disputes",
        /// Late charges, owed back until their system refund succeeds (a credit adds).
        LateCharges = "late_charges",
    }
}

/// One movement of money, as `GET /balance_transactions` lists it.
#[derive(Debug, Clone, Queryable, Selectable)]
#[diesel(table_name = ledger_movements)]
#[diesel(check_for_backend(diesel::pg::Pg))]
pub struct Movement {
    pub account_id: AccountId,
    pub id: Uuid,
    #[diesel(column_name = type_)]
    pub movement_type: MovementType,
    /// The payment or refund whose settle moved the money.
    pub operation_id: Uuid,
    pub payment_id: PaymentId,
    pub order_id: OrderId,
    pub debit_account: LedgerAccount,
    pub credit_account: LedgerAccount,
    pub amount: Decimal,
    pub currency: Currency,
    pub created_at: DateTime<Utc>,
}

impl Movement {
    /// What the movement did to the provider's balance, to the currency's minor unit: positive
    /// when money came in.
    pub fn net(&self) -> Decimal {
        let net = match (self.debit_account, self.credit_account) {
            (LedgerAccount::ProviderBalance, _) => self.amount,
            (_, LedgerAccount::ProviderBalance) => -self.amount,
            _ => Decimal::ZERO,
        };
        in_minor_units(net, self.currency)
    }

    /// The object whose settle moved the money: a refund for refund movements, else the payment.
    pub fn source(&self) -> (&'static str, Uuid) {
        match self.movement_type {
            MovementType::Refund
            | MovementType::RefundReversal
            | MovementType::RefundCorrection
            | MovementType::LateChargeRefund => ("refund", self.operation_id),
            MovementType::DisputeWithdrawal | MovementType::DisputeReinstatement => {
                ("dispute", self.operation_id)
            }
            _ => ("payment", self.payment_id.as_uuid()),
        }
    }
}

/// Which movements to list; every filter is optional.
#[derive(Debug, Clone, Copy, Default)]
pub struct Filter {
    pub payment_id: Option<PaymentId>,
    pub order_id: Option<OrderId>,
    pub movement_type: Option<MovementType>,
}

/// Up to `limit` of the account's movements, newest first (ids are time-ordered), after the
/// cursor `starting_after`; with whether there are more.
pub async fn list(
    conn: &mut AsyncPgConnection,
    account_id: AccountId,
    filter: Filter,
    limit: i64,
    starting_after: Option<Uuid>,
) -> QueryResult<(Vec<Movement>, bool)> {
    let mut query = ledger_movements::table.filter(ledger_movements::account_id.eq(account_id)).into_boxed();
    if let Some(payment_id) = filter.payment_id {
        query = query.filter(ledger_movements::payment_id.eq(payment_id));
    }
    if let Some(order_id) = filter.order_id {
        query = query.filter(ledger_movements::order_id.eq(order_id));
    }
    if let Some(movement_type) = filter.movement_type {
        query = query.filter(ledger_movements::type_.eq(movement_type));
    }
    if let Some(cursor) = starting_after {
        query = query.filter(ledger_movements::id.lt(cursor));
    }
    let mut rows: Vec<Movement> = query
        .order(ledger_movements::id.desc())
        .limit(limit + 1)
        .select(Movement::as_select())
        .load(conn)
        .await?;
    let has_more = rows.len() as i64 > limit;
    rows.truncate(usize::try_from(limit).unwrap_or(0));
    Ok((rows, has_more))
}

/// A payment whose money columns and ledger disagree.
#[derive(Debug, Clone, PartialEq, Eq, Queryable, Serialize)]
pub struct PaymentMismatch {
    pub account_id: AccountId,
    pub payment_id: PaymentId,
    pub currency: Currency,
    pub amount_captured: Decimal,
    pub ledger_captured: Decimal,
    pub amount_refunded: Decimal,
    pub ledger_refunded: Decimal,
    pub amount_disputed: Decimal,
    pub ledger_disputed: Decimal,
}

/// An order whose money is off by the ledger: what the provider keeps for it (late charges
/// apart) above its total, below zero, or not zero although every payment of it failed; or late
/// charges of its payments not given back.
#[derive(Debug, Clone, PartialEq, Eq, Queryable, Serialize)]
pub struct OrderFinding {
    pub account_id: AccountId,
    pub order_id: OrderId,
    pub currency: Currency,
    pub total_amount: Decimal,
    /// What the provider keeps for the order's payments, late charges apart.
    pub kept: Decimal,
    /// Late charges of the order's payments not given back yet.
    pub late_charges_unrefunded: Decimal,
    /// What the ledger says the provider holds for the order's payments.
    pub net: Decimal,
    /// What their columns say it holds: captured, less refunded, less disputed.
    pub taken: Decimal,
    /// Whether it is a violation; `false`: only late charges whose refund is still in flight (a
    /// system refund processing or watched, or its follow-up due).
    #[serde(skip)]
    pub violation: bool,
}

/// What `orderpay ledger check` found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    pub movements: i64,
    /// Movements that do not balance (refused by the table's CHECKs: any means they were dropped).
    pub unbalanced: i64,
    pub payment_mismatches: Vec<PaymentMismatch>,
    pub order_violations: Vec<OrderFinding>,
    /// Orders with late charges whose refund is still in flight: not right yet, not a violation.
    pub in_flight: Vec<OrderFinding>,
}

impl Report {
    /// Whether every invariant holds (money in flight is not a violation).
    pub fn holds(&self) -> bool {
        self.unbalanced == 0 && self.payment_mismatches.is_empty() && self.order_violations.is_empty()
    }
}

/// Checks the ledger's invariants at `now`: every movement balances; per payment, the ledger's
/// captured, refunded and disputed sums equal the payment's columns; per order, the ledger's net
/// equals captured less refunded less disputed, and what the provider keeps
/// (late charges apart) is never above the total nor below zero, and zero once every payment
/// failed; late charges are given back unless their refund is still in flight. One snapshot: the caller runs it in a repeatable-read transaction if it wants one.
pub async fn check(conn: &mut AsyncPgConnection, now: DateTime<Utc>) -> QueryResult<Report> {
    let movements = ledger_movements::table.count().get_result(conn).await?;
    let unbalanced = CheckMovements.get_result(conn).await?;
    let payment_mismatches: Vec<PaymentMismatch> = CheckPayments.load(conn).await?;
    let payment_mismatches = payment_mismatches
        .into_iter()
        .map(|payment| {
            let minor = |value| in_minor_units(value, payment.currency);
            PaymentMismatch {
                amount_captured: minor(payment.amount_captured),
                ledger_captured: minor(payment.ledger_captured),
                amount_refunded: minor(payment.amount_refunded),
                ledger_refunded: minor(payment.ledger_refunded),
                amount_disputed: minor(payment.amount_disputed),
                ledger_disputed: minor(payment.ledger_disputed),
                ..payment
            }
        })
        .collect();
    let (in_flight, order_violations) = CheckOrders { now: &now }
        .load::<OrderFinding>(conn)
        .await?
        .into_iter()
        .map(|order| OrderFinding {
            total_amount: in_minor_units(order.total_amount, order.currency),
            kept: in_minor_units(order.kept, order.currency),
            late_charges_unrefunded: in_minor_units(order.late_charges_unrefunded, order.currency),
            net: in_minor_units(order.net, order.currency),
            taken: in_minor_units(order.taken, order.currency),
            ..order
        })
        .partition(|order| !order.violation);
    Ok(Report { movements, unbalanced, payment_mismatches, order_violations, in_flight })
}

/// `value` written to `currency`'s minor unit (amounts are stored with more places).
pub(crate) fn in_minor_units(mut value: Decimal, currency: Currency) -> Decimal {
    value.rescale(currency.minor_units());
    value
}

crate::prepared_statement! {
    /// Movements that do not balance (`check_movements.sql`).
    pub(crate) struct CheckMovements("check_movements.sql") -> BigInt;
}

crate::prepared_statement! {
    /// Payments whose columns and ledger disagree (`check_payments.sql`).
    pub(crate) struct CheckPayments("check_payments.sql")
        -> (Uuid, Uuid, Text, Numeric, Numeric, Numeric, Numeric, Numeric, Numeric);
}

crate::prepared_statement! {
    /// Orders whose money is off, with whether that is a violation (`check_orders.sql`).
    pub(crate) struct CheckOrders<'a>("check_orders.sql")
        -> (Uuid, Uuid, Text, Numeric, Numeric, Numeric, Numeric, Numeric, Bool)
    {
        1 => now: &'a DateTime<Utc> as Timestamptz,
    }
}
