//! `orderpay ledger check`: the books' invariants, for an operator and for `make chaos`. Exits 1
//! with the list when one does not hold; money still in flight is listed but is no violation.

use chrono::Utc;
use clap::Subcommand;

use orderpay::config::DatabaseArgs;
use orderpay::ledger::{self, OrderFinding, Report};

use super::{Output, connect, table};

#[derive(Subcommand)]
pub enum LedgerCommand {
    /// Check the ledger: every movement balances; per payment, the ledger's captured, refunded
    /// and disputed sums equal the payment's columns; per order, the ledger's net equals
    /// captured less refunded less disputed, and what the provider keeps (late
    /// charges apart) is never above its total nor below zero, and zero once every payment
    /// failed; late charges are given back unless their refund is in flight.
    /// Exits 1 and lists what does not hold.
    Check {
        #[command(flatten)]
        output: Output,
        #[command(flatten)]
        database: DatabaseArgs,
    },
}

pub async fn run(command: LedgerCommand) -> anyhow::Result<()> {
    match command {
        LedgerCommand::Check { output, database } => {
            let mut conn = connect(&database).await?;
            // One snapshot: the movements and the columns they are compared with, read together.
            let report = conn
                .build_transaction()
                .repeatable_read()
                .read_only()
                .run(async |conn| ledger::check(conn, Utc::now()).await)
                .await?;
            print(&report, output)?;
            if !report.holds() {
                std::process::exit(1);
            }
        }
    }
    Ok(())
}

fn print(report: &Report, output: Output) -> anyhow::Result<()> {
    if output.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "holds": report.holds(),
                "report": report,
            }))?
        );
        return Ok(());
    }
    println!(
        "{} movements; {} unbalanced, {} payments disagreeing, {} orders wrong, {} in flight",
        report.movements,
        report.unbalanced,
        report.payment_mismatches.len(),
        report.order_violations.len(),
        report.in_flight.len()
    );
    if !report.payment_mismatches.is_empty() {
        let rows: Vec<Vec<String>> = report
            .payment_mismatches
            .iter()
            .map(|payment| {
                vec![
                    payment.payment_id.to_string(),
                    payment.currency.to_string(),
                    payment.amount_captured.to_string(),
                    payment.ledger_captured.to_string(),
                    payment.amount_refunded.to_string(),
                    payment.ledger_refunded.to_string(),
                    payment.amount_disputed.to_string(),
                    payment.ledger_disputed.to_string(),
                ]
            })
            .collect();
        let columns = [
            "PAYMENT",
            "CURRENCY",
            "CAPTURED",
            "LEDGER CAPTURED",
            "REFUNDED",
            "LEDGER REFUNDED",
            "DISPUTED",
            "LEDGER DISPUTED",
        ];
        print!("\npayments whose columns and ledger disagree:\n{}", table(&columns, &rows));
    }
    for (title, orders) in [
        ("orders whose money is wrong", &report.order_violations),
        ("orders with late charges whose refund is in flight (not a violation yet)", &report.in_flight),
    ] {
        if !orders.is_empty() {
            print!(
                "\n{title}:\n{}",
                table(
                    &["ORDER", "CURRENCY", "TOTAL", "KEPT", "LATE CHARGES UNREFUNDED", "NET", "TAKEN"],
                    &order_rows(orders)
                )
            );
        }
    }
    Ok(())
}

fn order_rows(orders: &[OrderFinding]) -> Vec<Vec<String>> {
    orders
        .iter()
        .map(|order| {
            vec![
                order.order_id.to_string(),
                order.currency.to_string(),
                order.total_amount.to_string(),
                order.kept.to_string(),
                order.late_charges_unrefunded.to_string(),
                order.net.to_string(),
                order.taken.to_string(),
            ]
        })
        .collect()
}
