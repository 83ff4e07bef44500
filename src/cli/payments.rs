//! `orderpay payments list | show | resolve`: the flags and the printing. What the commands read
//! and the one change they make live in `operations::operator`.

use std::time::Duration;

use clap::Subcommand;

use orderpay::ids::{AccountId, PaymentId};
use orderpay::operations::late_charge::TakenBack;
use orderpay::operations::operator::{self, ListFilter, PaymentView, Report, Resolve, Resolved, Target};
use orderpay::payments::PaymentStatus;

use super::{EngineArgs, Output, maybe_time, print_list, print_one, table, time};

#[derive(Subcommand)]
pub enum PaymentsCommand {
    /// List payments, newest first, with what is in flight on each and the reconciler's attempts.
    ///
    /// The JSON objects carry the API's fields (as GET /payments/{id} renders a payment) and the
    /// operator's: account_id, idempotency_key, in_flight, attempts, next_check_at, last_error,
    /// lease_until, stuck.
    List {
        /// Only payments in this status: processing, requires_capture, succeeded, failed, canceled.
        #[arg(long, value_parser = status)]
        status: Option<PaymentStatus>,
        /// Only stuck payments: processing, and what is in flight on them (the charge or
        /// authorization, or a capture or void) has had ORDERPAY_RECONCILE_MAX_ATTEMPTS checks
        /// with its outcome still unknown. They need a person.
        #[arg(long)]
        stuck: bool,
        /// Only payments created longer ago than this: 90s, 30m, 2h, 1d, or a sum such as 1h30m.
        #[arg(long, value_parser = super::duration)]
        older_than: Option<Duration>,
        /// Only this account's payments (its id, as `orderpay accounts list` shows it).
        #[arg(long, value_parser = super::account_id)]
        account: Option<AccountId>,
        /// At most this many.
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(i64).range(1..=10_000))]
        limit: i64,
        #[command(flatten)]
        output: Output,
        #[command(flatten)]
        settings: EngineArgs,
    },
    /// Show one payment with its refunds, captures and voids, transitions and the provider's view.
    ///
    /// Every transition of the payment and of its captures, voids and refunds with its actor and
    /// detail (the audit trail), and the provider's current view of its charge from a live lookup
    /// by the downstream key, or why the provider could not be asked.
    Show {
        /// The payment's id, as `payments list` shows it.
        #[arg(value_name = "PAYMENT_ID", value_parser = payment_id)]
        id: PaymentId,
        #[command(flatten)]
        output: Output,
        #[command(flatten)]
        settings: EngineArgs,
    },
    /// Settle by hand a payment whose charge or authorization is in flight.
    ///
    /// Only once the provider's live view agrees: `succeeded` needs a captured charge (or an
    /// authorization, for a manual-capture payment, which becomes requires_capture), `failed` a
    /// provider that holds no money for it. Refused otherwise, with what the provider says,
    /// unless --force. Applied under a lease through the payment's own settle (audit actor
    /// `operator`), so it never races a retry or the reconciler into a second transition.
    Resolve {
        /// The payment's id, as `payments list` shows it.
        #[arg(value_name = "PAYMENT_ID", value_parser = payment_id)]
        id: PaymentId,
        /// What the payment's outcome is.
        #[arg(long = "as", value_name = "OUTCOME", value_enum)]
        to: Target,
        /// Why, for the audit trail (actor `operator`); never shown to the client.
        #[arg(long)]
        reason: String,
        /// Apply it although the provider's view does not agree. Forcing `failed` over money the
        /// provider holds takes it back: the charge is refunded (or the authorization voided) by
        /// the system.
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        output: Output,
        #[command(flatten)]
        settings: EngineArgs,
    },
}

fn status(text: &str) -> Result<PaymentStatus, String> {
    PaymentStatus::parse(text.trim()).ok_or_else(|| {
        let known: Vec<&str> = PaymentStatus::ALL.iter().map(PaymentStatus::as_str).collect();
        format!("{text:?} is not a payment status ({})", known.join(", "))
    })
}

fn payment_id(text: &str) -> Result<PaymentId, String> {
    PaymentId::parse(text.trim()).ok_or_else(|| format!("{text:?} is not a payment id (a UUID)"))
}

pub async fn run(command: PaymentsCommand) -> anyhow::Result<()> {
    match command {
        PaymentsCommand::List { status, stuck, older_than, account, limit, output, settings } => {
            let mut conn = super::connect(&settings.database).await?;
            let filter = ListFilter { status, stuck, older_than, account, limit };
            let max_attempts = settings.reconcile.reconcile_max_attempts;
            let listed = operator::list(&mut conn, &filter, max_attempts).await?;
            let columns =
                ["ID", "ACCOUNT", "STATUS", "AMOUNT", "IN FLIGHT", "ATTEMPTS", "CREATED", "LAST ERROR"];
            print_list(&listed, output, &columns, |view| {
                vec![
                    view.payment.id.to_string(),
                    view.operating.account_id.to_string(),
                    view.payment.status.to_string(),
                    format!("{} {}", view.payment.amount, view.payment.currency()),
                    in_flight(view),
                    view.operating.attempts.to_string(),
                    time(view.payment.created_at),
                    view.operating.last_error.clone().unwrap_or_else(|| "-".to_owned()),
                ]
            })?;
        }
        PaymentsCommand::Show { id, output, settings } => {
            let (engine, config) = settings.engine().await?;
            let Some(report) = operator::show(&engine, &config, id).await? else {
                anyhow::bail!("no payment {id}");
            };
            print_one(&report, output, &fields(&report))?;
            if !output.json {
                print_sections(&report);
            }
        }
        PaymentsCommand::Resolve { id, to, reason, force, output, settings } => {
            let (engine, config) = settings.engine().await?;
            let request = Resolve { payment_id: id, to, reason, force };
            let resolved = operator::resolve(&engine, &config, &request).await?;
            print_one(&resolved, output, &resolution(&resolved))?;
        }
    }
    Ok(())
}

/// What is in flight on a payment, and whether it is stuck: `charge (stuck)`, `-`, or a late
/// charge left unrefunded.
fn in_flight(view: &PaymentView) -> String {
    match view.operating.in_flight {
        None if view.operating.stuck => "late charge unrefunded (stuck)".to_owned(),
        None => "-".to_owned(),
        Some(what) if view.operating.stuck => format!("{} (stuck)", what.as_str()),
        Some(what) => what.as_str().to_owned(),
    }
}

fn or_dash(value: Option<&str>) -> String {
    value.unwrap_or("-").to_owned()
}

/// The payment's own lines: the API's fields, then the operator's.
fn payment_fields(view: &PaymentView) -> Vec<(&'static str, String)> {
    let (payment, operating) = (&view.payment, &view.operating);
    let failure = payment.failure_code.as_ref().map(|code| match &payment.failure_message {
        Some(message) => format!("{code}: {message}"),
        None => code.clone(),
    });
    vec![
        ("payment", payment.id.to_string()),
        ("account", payment.account_id.to_string()),
        ("order", payment.order_id.to_string()),
        ("status", payment.status.to_string()),
        ("amount", format!("{} {}", payment.amount, payment.currency())),
        ("capture method", payment.capture_method.to_string()),
        ("captured", payment.amount_captured.to_string()),
        ("refunded", payment.amount_refunded.to_string()),
        ("disputed", payment.amount_disputed.to_string()),
        ("payment method", payment.payment_method.clone()),
        ("provider charge", or_dash(payment.provider_charge_id.as_deref())),
        ("failure", or_dash(failure.as_deref())),
        ("idempotency key", or_dash(operating.idempotency_key.as_deref())),
        ("created", time(payment.created_at)),
        ("updated", time(payment.updated_at)),
        ("in flight", in_flight(view)),
        ("attempts", operating.attempts.to_string()),
        ("next check", maybe_time(operating.next_check_at)),
        ("last error", or_dash(operating.last_error.as_deref())),
        (
            "lease",
            operating
                .lease_until
                .map_or_else(|| "-".to_owned(), |until| format!("held until {}", time(until))),
        ),
    ]
}

fn fields(report: &Report) -> Vec<(&'static str, String)> {
    let mut fields = payment_fields(&report.payment);
    if let Some(late_charge) = &report.payment.operating.late_charge {
        fields.push(("late charge", late_charge.describe()));
    }
    fields.insert(3, ("order status", or_dash(report.order_status.as_ref().map(|status| status.as_str()))));
    fields.push(("provider", report.provider.describe()));
    fields
}

/// The refunds, the captures and voids, and the transitions, as tables.
fn print_sections(report: &Report) {
    let refunds: Vec<Vec<String>> = report
        .refunds
        .iter()
        .map(|view| {
            let refund = &view.refund;
            vec![
                refund.id.to_string(),
                refund.status.to_string(),
                refund.amount.to_string(),
                if view.operating.system { "system" } else { "client" }.to_owned(),
                or_dash(refund.provider_refund_id.as_deref()),
                view.operating.attempts.to_string(),
                time(refund.created_at),
            ]
        })
        .collect();
    section("refunds", &["ID", "STATUS", "AMOUNT", "BY", "PROVIDER REFUND", "ATTEMPTS", "CREATED"], &refunds);
    let actions: Vec<Vec<String>> = report
        .captures_and_voids
        .iter()
        .map(|action| {
            vec![
                action.id.to_string(),
                action.kind.to_string(),
                action.status.to_string(),
                or_dash(action.amount.as_deref()),
                or_dash(action.failure_code.as_deref()),
                action.attempts.to_string(),
                time(action.created_at),
            ]
        })
        .collect();
    let columns = ["ID", "KIND", "STATUS", "AMOUNT", "FAILURE", "ATTEMPTS", "CREATED"];
    section("captures and voids", &columns, &actions);
    let transitions: Vec<Vec<String>> = report
        .transitions
        .iter()
        .map(|transition| {
            vec![
                time(transition.at),
                format!("{} {}", transition.subject, transition.subject_id),
                transition.from_status.clone(),
                transition.to_status.clone(),
                transition.actor.to_string(),
                or_dash(transition.detail.as_deref()),
            ]
        })
        .collect();
    section("transitions", &["AT", "SUBJECT", "FROM", "TO", "ACTOR", "DETAIL"], &transitions);
}

fn section(title: &str, columns: &[&str], rows: &[Vec<String>]) {
    println!("\n{title}:");
    if rows.is_empty() {
        println!("none");
    } else {
        print!("{}", table(columns, rows));
    }
}

/// What a resolution did, line by line.
fn resolution(resolved: &Resolved) -> Vec<(&'static str, String)> {
    let payment = &resolved.payment.payment;
    let order = or_dash(resolved.order_status.as_ref().map(|status| status.as_str()));
    let mut lines = vec![
        ("resolved", format!("payment {} processing -> {} (actor operator)", payment.id, payment.status)),
        ("order", format!("{} {order}", payment.order_id)),
        ("provider", resolved.provider.describe()),
        ("forced over", or_dash(resolved.forced_over.as_deref())),
    ];
    if let Some(taken_back) = &resolved.taken_back {
        let said = match taken_back {
            TakenBack::Refunded { refund_id, status } => {
                format!("refund {refund_id} by the system: {status}")
            }
            TakenBack::Voided { charge_id } => format!("authorization {charge_id} voided"),
            TakenBack::AlreadyRecorded => "already recorded; its refund was started then".to_owned(),
            TakenBack::Refused { reason } => format!("not refunded: {reason}"),
            TakenBack::Left { reason } => format!("left for the late-charge watch: {reason}"),
        };
        lines.push(("taken back", said));
    }
    lines
}
