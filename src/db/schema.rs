// @generated-equivalent: written to match `diesel print-schema` for the migrations in
// migrations/; the integration tests exercise every table through it.

diesel::table! {
    accounts (id) {
        id -> Uuid,
        name -> Text,
        api_key_hash -> Bytea,
        created_at -> Timestamptz,
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
    idempotency_keys (account_id, key) {
        account_id -> Uuid,
        key -> Text,
        method -> Text,
        route -> Text,
        fingerprint -> Bytea,
        state -> Text,
        locked_until -> Nullable<Timestamptz>,
        recovery_point -> Text,
        resource_id -> Nullable<Uuid>,
        response_status -> Nullable<Int2>,
        response_headers -> Nullable<Jsonb>,
        response_body -> Nullable<Bytea>,
        created_at -> Timestamptz,
        expires_at -> Timestamptz,
        lease_id -> Nullable<Uuid>,
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
    }
}

diesel::allow_tables_to_appear_in_same_query!(
    accounts,
    orders,
    order_items,
    idempotency_keys,
    payments,
    payment_events
);
