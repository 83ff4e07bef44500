// @generated automatically by Diesel CLI.

pub mod sql_types {
    #[derive(diesel::sql_types::SqlType)]
    #[diesel(postgres_type(name = "xid8", schema = "pg_catalog"))]
    pub struct Xid8;
}

diesel::table! {
    accounts (id) {
        id -> Uuid,
        name -> Text,
        created_at -> Timestamptz,
    }
}

diesel::table! {
    api_key_revocations (singleton) {
        singleton -> Bool,
        generation -> Int8,
    }
}

diesel::table! {
    api_keys (id) {
        id -> Uuid,
        account_id -> Uuid,
        key_hash -> Bytea,
        prefix -> Nullable<Text>,
        created_at -> Timestamptz,
        last_used_at -> Nullable<Timestamptz>,
        revoked_at -> Nullable<Timestamptz>,
    }
}

diesel::table! {
    dispute_listing (id) {
        id -> Bool,
        created_from -> Timestamptz,
        listed_at -> Nullable<Timestamptz>,
    }
}

diesel::table! {
    dispute_responses (account_id, id) {
        account_id -> Uuid,
        id -> Uuid,
        dispute_id -> Uuid,
        kind -> Text,
        status -> Text,
        evidence -> Nullable<Text>,
        failure_code -> Nullable<Text>,
        failure_message -> Nullable<Text>,
        idempotency_key -> Nullable<Text>,
        attempts -> Int4,
        next_check_at -> Nullable<Timestamptz>,
        last_error -> Nullable<Text>,
        lease_until -> Nullable<Timestamptz>,
        lease_id -> Nullable<Uuid>,
        last_send_at -> Nullable<Timestamptz>,
        answer_status -> Nullable<Int2>,
        answer_body -> Nullable<Bytea>,
        created_at -> Timestamptz,
        updated_at -> Timestamptz,
        answer_event_id -> Nullable<Uuid>,
    }
}

diesel::table! {
    disputes (account_id, id) {
        account_id -> Uuid,
        id -> Uuid,
        payment_id -> Uuid,
        order_id -> Uuid,
        provider_dispute_id -> Text,
        amount -> Numeric,
        currency -> Text,
        reason -> Text,
        status -> Text,
        closed_reason -> Nullable<Text>,
        evidence_due_by -> Nullable<Timestamptz>,
        amount_withdrawn -> Numeric,
        amount_reinstated -> Numeric,
        provider_created_at -> Timestamptz,
        created_at -> Timestamptz,
        updated_at -> Timestamptz,
    }
}

diesel::table! {
    use diesel::sql_types::*;
    use super::sql_types::Xid8;

    events (account_id, id) {
        account_id -> Uuid,
        id -> Uuid,
        txid -> Xid8,
        seq -> Int8,
        #[sql_name = "type"]
        type_ -> Text,
        data -> Bytea,
        created_at -> Timestamptz,
    }
}

diesel::table! {
    idempotency_key_audit (account_id, key, created_at) {
        account_id -> Uuid,
        key -> Text,
        method -> Text,
        route -> Text,
        fingerprint -> Bytea,
        resource_kind -> Text,
        resource_id -> Uuid,
        response_status -> Nullable<Int2>,
        created_at -> Timestamptz,
        expires_at -> Timestamptz,
    }
}

diesel::table! {
    idempotency_keys (account_id, key) {
        account_id -> Uuid,
        key -> Text,
        method -> Text,
        route -> Text,
        fingerprint -> Bytea,
        resource_id -> Uuid,
        response_status -> Nullable<Int2>,
        response_headers -> Nullable<Jsonb>,
        response_body -> Nullable<Bytea>,
        created_at -> Timestamptz,
        expires_at -> Timestamptz,
        resource_kind -> Text,
        answer_event_id -> Nullable<Uuid>,
    }
}

diesel::table! {
    ledger_movements (account_id, id) {
        account_id -> Uuid,
        id -> Uuid,
        #[sql_name = "type"]
        type_ -> Text,
        operation_id -> Uuid,
        payment_id -> Uuid,
        order_id -> Uuid,
        debit_account -> Text,
        credit_account -> Text,
        amount -> Numeric,
        currency -> Text,
        created_at -> Timestamptz,
        occurrence -> Int4,
    }
}

diesel::table! {
    order_items (account_id, order_id, line_number) {
        account_id -> Uuid,
        order_id -> Uuid,
        line_number -> Int2,
        sku -> Text,
        quantity -> Int4,
        unit_price -> Numeric,
        amount -> Numeric,
    }
}

diesel::table! {
    orders (account_id, id) {
        account_id -> Uuid,
        id -> Uuid,
        status -> Text,
        currency -> Text,
        total_amount -> Numeric,
        customer_id -> Nullable<Text>,
        metadata -> Jsonb,
        created_at -> Timestamptz,
        updated_at -> Timestamptz,
    }
}

diesel::table! {
    payment_events (account_id, payment_id, id) {
        account_id -> Uuid,
        payment_id -> Uuid,
        id -> Int8,
        from_status -> Text,
        to_status -> Text,
        actor -> Text,
        detail -> Nullable<Text>,
        at -> Timestamptz,
        subject -> Text,
        subject_id -> Uuid,
    }
}

diesel::table! {
    payment_operations (account_id, id) {
        account_id -> Uuid,
        id -> Uuid,
        payment_id -> Uuid,
        kind -> Text,
        status -> Text,
        amount -> Nullable<Numeric>,
        failure_code -> Nullable<Text>,
        failure_message -> Nullable<Text>,
        idempotency_key -> Nullable<Text>,
        attempts -> Int4,
        next_check_at -> Nullable<Timestamptz>,
        last_error -> Nullable<Text>,
        lease_until -> Nullable<Timestamptz>,
        lease_id -> Nullable<Uuid>,
        last_send_at -> Nullable<Timestamptz>,
        answer_status -> Nullable<Int2>,
        answer_body -> Nullable<Bytea>,
        created_at -> Timestamptz,
        updated_at -> Timestamptz,
        answer_event_id -> Nullable<Uuid>,
    }
}

diesel::table! {
    payments (account_id, id) {
        account_id -> Uuid,
        id -> Uuid,
        order_id -> Uuid,
        status -> Text,
        amount -> Numeric,
        currency -> Text,
        payment_method -> Text,
        provider_charge_id -> Nullable<Text>,
        failure_code -> Nullable<Text>,
        failure_message -> Nullable<Text>,
        idempotency_key -> Nullable<Text>,
        attempts -> Int4,
        next_check_at -> Nullable<Timestamptz>,
        last_error -> Nullable<Text>,
        created_at -> Timestamptz,
        updated_at -> Timestamptz,
        lease_until -> Nullable<Timestamptz>,
        lease_id -> Nullable<Uuid>,
        last_send_at -> Nullable<Timestamptz>,
        answer_status -> Nullable<Int2>,
        answer_body -> Nullable<Bytea>,
        capture_method -> Text,
        amount_captured -> Numeric,
        amount_refunded -> Numeric,
        amount_refunding -> Numeric,
        authorization_expires_at -> Nullable<Timestamptz>,
        late_watch_until -> Nullable<Timestamptz>,
        late_charge_amount -> Nullable<Numeric>,
        amount_disputed -> Numeric,
        answer_event_id -> Nullable<Uuid>,
    }
}

diesel::table! {
    provider_webhooks (id) {
        id -> Text,
        event_type -> Text,
        object_id -> Text,
        result -> Text,
        account_id -> Nullable<Uuid>,
        subject -> Nullable<Text>,
        subject_id -> Nullable<Uuid>,
        received_at -> Timestamptz,
    }
}

diesel::table! {
    refunds (account_id, id) {
        account_id -> Uuid,
        id -> Uuid,
        payment_id -> Uuid,
        order_id -> Uuid,
        status -> Text,
        amount -> Numeric,
        currency -> Text,
        reason -> Nullable<Text>,
        provider_refund_id -> Nullable<Text>,
        failure_code -> Nullable<Text>,
        failure_message -> Nullable<Text>,
        idempotency_key -> Nullable<Text>,
        attempts -> Int4,
        next_check_at -> Nullable<Timestamptz>,
        last_error -> Nullable<Text>,
        lease_until -> Nullable<Timestamptz>,
        lease_id -> Nullable<Uuid>,
        last_send_at -> Nullable<Timestamptz>,
        answer_status -> Nullable<Int2>,
        answer_body -> Nullable<Bytea>,
        created_at -> Timestamptz,
        updated_at -> Timestamptz,
        late_watch_until -> Nullable<Timestamptz>,
        absent_since -> Nullable<Timestamptz>,
        answer_event_id -> Nullable<Uuid>,
    }
}

diesel::table! {
    use diesel::sql_types::*;
    use super::sql_types::Xid8;

    relay_cursors (relay) {
        relay -> Text,
        txid -> Xid8,
        seq -> Int8,
        updated_at -> Timestamptz,
        system_identifier -> Nullable<Int8>,
    }
}

diesel::table! {
    settlement_items (id) {
        id -> Uuid,
        category -> Text,
        found_as -> Text,
        run_id -> Uuid,
        object_id -> Nullable<Uuid>,
        movement_class -> Text,
        rank -> Nullable<Int4>,
        provider_id -> Nullable<Text>,
        provider_category -> Nullable<Text>,
        provider_amount -> Nullable<Numeric>,
        provider_currency -> Nullable<Text>,
        provider_source -> Nullable<Text>,
        provider_key -> Nullable<Text>,
        provider_created -> Nullable<Timestamptz>,
        account_id -> Nullable<Uuid>,
        ledger_movement_id -> Nullable<Uuid>,
        ours_type -> Nullable<Text>,
        ours_amount -> Nullable<Numeric>,
        ours_currency -> Nullable<Text>,
        ours_created -> Nullable<Timestamptz>,
        ours_status -> Nullable<Text>,
        resolved_at -> Nullable<Timestamptz>,
        resolution -> Nullable<Text>,
        note -> Nullable<Text>,
    }
}

diesel::table! {
    settlement_runs (id) {
        id -> Uuid,
        window_start -> Timestamptz,
        window_end -> Timestamptz,
        scheduled -> Bool,
        started_at -> Timestamptz,
        finished_at -> Nullable<Timestamptz>,
        report -> Nullable<Jsonb>,
    }
}

diesel::table! {
    webhook_deliveries (account_id, id) {
        account_id -> Uuid,
        id -> Uuid,
        endpoint_id -> Uuid,
        event_id -> Uuid,
        origin -> Text,
        status -> Text,
        attempts -> Int4,
        next_attempt_at -> Nullable<Timestamptz>,
        lease_until -> Nullable<Timestamptz>,
        lease_id -> Nullable<Uuid>,
        last_attempt_at -> Nullable<Timestamptz>,
        last_status -> Nullable<Int2>,
        last_error -> Nullable<Text>,
        failing_since -> Nullable<Timestamptz>,
        created_at -> Timestamptz,
        updated_at -> Timestamptz,
    }
}

diesel::table! {
    webhook_delivery_attempts (account_id, delivery_id, attempt) {
        account_id -> Uuid,
        delivery_id -> Uuid,
        attempt -> Int4,
        started_at -> Timestamptz,
        http_status -> Nullable<Int2>,
        latency_ms -> Int4,
        error -> Nullable<Text>,
    }
}

diesel::table! {
    webhook_endpoints (account_id, id) {
        account_id -> Uuid,
        id -> Uuid,
        url -> Text,
        description -> Nullable<Text>,
        enabled_events -> Array<Nullable<Text>>,
        secret -> Nullable<Bytea>,
        previous_secret -> Nullable<Bytea>,
        previous_secret_expires_at -> Nullable<Timestamptz>,
        created_at -> Timestamptz,
        updated_at -> Timestamptz,
        deleted_at -> Nullable<Timestamptz>,
    }
}

diesel::joinable!(api_keys -> accounts (account_id));
diesel::joinable!(settlement_items -> settlement_runs (run_id));

diesel::allow_tables_to_appear_in_same_query!(
    accounts,
    api_key_revocations,
    api_keys,
    dispute_listing,
    dispute_responses,
    disputes,
    events,
    idempotency_key_audit,
    idempotency_keys,
    ledger_movements,
    order_items,
    orders,
    payment_events,
    payment_operations,
    payments,
    provider_webhooks,
    refunds,
    relay_cursors,
    settlement_items,
    settlement_runs,
    webhook_deliveries,
    webhook_delivery_attempts,
    webhook_endpoints,
);
