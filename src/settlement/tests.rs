use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use rust_decimal::Decimal;
use uuid::Uuid;

use super::job::{SettlementConfig, closed_windows};
use super::*;

fn at(second: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2030, 1, 1, 0, 0, second).unwrap()
}

fn provider(category: &str, amount: i64, key: Option<String>) -> BalanceTransaction {
    BalanceTransaction {
        id: format!("txn_{}", Uuid::now_v7().simple()),
        category: category.to_owned(),
        amount: Decimal::new(amount, 2),
        currency: "usd".to_owned(),
        source: "ch_1".to_owned(),
        source_key: key,
        created: at(1),
    }
}

fn ours(movement_type: MovementType, object: Uuid, amount: i64, second: u32) -> OurMovement {
    let refund = MovementClass::of_type(movement_type).names_a_refund();
    OurMovement {
        id: Uuid::now_v7(),
        account_id: AccountId::generate(),
        movement_type,
        operation_id: object,
        payment_id: if refund { Uuid::now_v7() } else { object },
        amount: Decimal::new(amount, 2),
        currency: "USD".to_owned(),
        created_at: at(second),
    }
}

fn pay_key(id: Uuid) -> Option<String> {
    Some(format!("orderpay_pay_{id}"))
}

fn category(decision: &Decision) -> Category {
    match decision {
        Decision::Insert(item) => item.category,
        Decision::AttachProvider { category, .. } => *category,
        Decision::AttachOurs { .. } => panic!("not a provider decision"),
    }
}

#[test]
fn each_provider_movement_lands_in_the_category_its_comparison_gives() {
    let (paid, differs, recorded_failed, refund, euros) =
        (Uuid::now_v7(), Uuid::now_v7(), Uuid::now_v7(), Uuid::now_v7(), Uuid::now_v7());
    let known = Known::new(
        vec![
            ours(MovementType::ChargeCaptured, paid, 1000, 1),
            ours(MovementType::ChargeCaptured, differs, 1000, 1),
            ours(MovementType::Refund, refund, 250, 2),
            ours(MovementType::ChargeCaptured, euros, 1000, 1),
        ],
        Vec::new(),
        HashMap::from([(
            recorded_failed,
            OurOperation { account_id: AccountId::generate(), status: "failed".into() },
        )]),
    );
    let mut in_euros = provider("charge", 1000, pay_key(euros));
    in_euros.currency = "EUR".into();
    let page = vec![
        provider("charge", 1000, pay_key(paid)),
        provider("charge", 999, pay_key(differs)),
        provider("charge", 500, pay_key(recorded_failed)),
        provider("charge", 500, pay_key(Uuid::now_v7())),
        provider("charge", 500, None),
        provider("payout", -500, pay_key(paid)),
        provider("refund", -250, Some(format!("orderpay_refund_{refund}"))),
        provider("charge", 1000, pay_key(paid)),
        in_euros,
    ];
    let decided: Vec<Category> = decide_provider_page(page, &known).iter().map(category).collect();
    assert_eq!(
        decided,
        [
            Category::Matched,
            Category::AmountMismatch,
            Category::StatusMismatch,
            Category::MissingOurs,
            Category::MissingOurs,
            Category::MissingOurs,
            Category::Matched,
            // The same charge reported twice: the second has no movement of ours to stand for.
            Category::DuplicateProvider,
            Category::CurrencyMismatch,
        ]
    );
}

#[test]
fn a_provider_movement_completes_an_item_that_held_only_ours() {
    let payment = Uuid::now_v7();
    let movement = ours(MovementType::ChargeCaptured, payment, 1000, 1);
    let item = ExistingItem {
        id: Uuid::now_v7(),
        object_id: payment,
        class: MovementClass::Charge,
        rank: Some(1),
        has_provider: false,
        ledger_movement_id: Some(movement.id),
        provider_amount: None,
        provider_currency: None,
    };
    let known = Known::new(vec![movement], vec![item.clone()], HashMap::new());
    let decided = decide_provider_page(vec![provider("charge", 1000, pay_key(payment))], &known);
    assert!(
        matches!(&decided[..], [Decision::AttachProvider { item: id, category: Category::Matched, .. }] if *id == item.id)
    );
}

#[test]
fn ranks_count_the_provider_movements_earlier_runs_held() {
    // A refund reversed and then found carried out after all: two refund-class movements of
    // ours; the provider's second refund movement is matched with our second.
    let refund = Uuid::now_v7();
    let first = ours(MovementType::Refund, refund, 250, 1);
    let second = ours(MovementType::RefundCorrection, refund, 250, 5);
    let held = ExistingItem {
        id: Uuid::now_v7(),
        object_id: refund,
        class: MovementClass::Refund,
        rank: Some(1),
        has_provider: true,
        ledger_movement_id: Some(first.id),
        provider_amount: Some(Decimal::new(-250, 2)),
        provider_currency: Some("USD".into()),
    };
    let known = Known::new(vec![second.clone(), first], vec![held], HashMap::new());
    let decided = decide_provider_page(
        vec![provider("refund", -250, Some(format!("orderpay_refund_{refund}")))],
        &known,
    );
    let [Decision::Insert(item)] = &decided[..] else { panic!("one new item: {decided:?}") };
    assert_eq!((item.category, item.rank), (Category::Matched, Some(2)));
    assert_eq!(item.ours.as_ref().map(|o| o.id), Some(second.id));
}

#[test]
fn our_movement_completes_an_item_that_held_only_the_providers_else_it_is_missing_there() {
    let (late, unreported) = (Uuid::now_v7(), Uuid::now_v7());
    let recorded_late = ours(MovementType::ChargeCaptured, late, 1000, 9);
    let waiting = ExistingItem {
        id: Uuid::now_v7(),
        object_id: late,
        class: MovementClass::Charge,
        rank: Some(1),
        has_provider: true,
        ledger_movement_id: None,
        provider_amount: Some(Decimal::new(1000, 2)),
        provider_currency: Some("USD".into()),
    };
    let only_ours = ours(MovementType::LateCharge, unreported, 700, 3);
    let known =
        Known::new(vec![recorded_late.clone(), only_ours.clone()], vec![waiting.clone()], HashMap::new());
    let decided = decide_ours(vec![recorded_late, only_ours], &known);
    assert!(
        matches!(&decided[0], Decision::AttachOurs { item, category: Category::Matched, .. } if *item == waiting.id)
    );
    assert!(matches!(&decided[1], Decision::Insert(item) if item.category == Category::MissingProvider));
}

#[test]
fn our_movements_are_signed_as_the_providers() {
    let object = Uuid::now_v7();
    let net = |movement_type| ours(movement_type, object, 100, 1).net();
    assert_eq!(net(MovementType::ChargeCaptured), Decimal::ONE);
    assert_eq!(net(MovementType::LateCharge), Decimal::ONE);
    assert_eq!(net(MovementType::Refund), -Decimal::ONE);
    assert_eq!(net(MovementType::LateChargeRefund), -Decimal::ONE);
    assert_eq!(net(MovementType::RefundCorrection), -Decimal::ONE);
    assert_eq!(net(MovementType::RefundReversal), Decimal::ONE);
    assert_eq!(net(MovementType::DisputeWithdrawal), -Decimal::ONE);
    assert_eq!(net(MovementType::DisputeReinstatement), Decimal::ONE);
}

#[test]
fn windows_are_aligned_closed_and_caught_up_oldest_first() {
    let config = SettlementConfig {
        interval: Duration::from_secs(86_400),
        lag: Duration::from_secs(3 * 3600),
        page_size: 100,
    };
    let now = Utc.with_ymd_and_hms(2030, 1, 10, 2, 0, 0).unwrap();
    // At 02:00 with a 3-hour lag, the 9th is not closed yet: the newest closed window is the 8th.
    let windows = closed_windows(now, &config);
    let day = |d| Utc.with_ymd_and_hms(2030, 1, d, 0, 0, 0).unwrap();
    assert_eq!(
        windows,
        [
            Window { start: day(6), end: day(7) },
            Window { start: day(7), end: day(8) },
            Window { start: day(8), end: day(9) },
        ]
    );
    let later = Utc.with_ymd_and_hms(2030, 1, 10, 3, 0, 0).unwrap();
    assert_eq!(closed_windows(later, &config).last(), Some(&Window { start: day(9), end: day(10) }));
}

#[test]
fn a_window_floor_is_below_every_id_made_in_it() {
    let start = at(7);
    let floor = repository::window_floor(start);
    for _ in 0..100 {
        let id = Uuid::new_v7(uuid::Timestamp::from_unix(
            uuid::NoContext,
            start.timestamp() as u64,
            start.timestamp_subsec_nanos(),
        ));
        assert!(id > floor);
    }
    assert!(repository::window_floor(at(6)) < floor);
}
