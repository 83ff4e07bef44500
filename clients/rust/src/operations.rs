//! Every operation of openapi.yaml, by its `operationId`: those the client calls, and those a
//! merchant never calls. A test fails when openapi.yaml gains an operation in neither list.

/// The operations the client covers, each with its method and path template.
pub const COVERED: &[(&str, &str, &str)] = &[
    ("createOrder", "POST", "/orders"),
    ("listOrders", "GET", "/orders"),
    ("getOrder", "GET", "/orders/{id}"),
    ("cancelOrder", "POST", "/orders/{id}/cancel"),
    ("createPayment", "POST", "/payments"),
    ("listPayments", "GET", "/payments"),
    ("getPayment", "GET", "/payments/{id}"),
    ("capturePayment", "POST", "/payments/{id}/capture"),
    ("voidPayment", "POST", "/payments/{id}/void"),
    ("createRefund", "POST", "/refunds"),
    ("listRefunds", "GET", "/refunds"),
    ("getRefund", "GET", "/refunds/{id}"),
    ("listBalanceTransactions", "GET", "/balance_transactions"),
    ("listDisputes", "GET", "/disputes"),
    ("getDispute", "GET", "/disputes/{id}"),
    ("submitDisputeEvidence", "POST", "/disputes/{id}/evidence"),
    ("acceptDispute", "POST", "/disputes/{id}/accept"),
    ("listEvents", "GET", "/events"),
    ("getEvent", "GET", "/events/{id}"),
    ("createWebhookEndpoint", "POST", "/webhook_endpoints"),
    ("listWebhookEndpoints", "GET", "/webhook_endpoints"),
    ("getWebhookEndpoint", "GET", "/webhook_endpoints/{id}"),
    ("deleteWebhookEndpoint", "DELETE", "/webhook_endpoints/{id}"),
    ("rotateWebhookEndpointSecret", "POST", "/webhook_endpoints/{id}/rotate_secret"),
];

/// The operations a merchant never calls: the provider's webhooks, health, metrics, the docs.
pub const EXCLUDED: &[&str] = &["receiveProviderWebhook", "healthz", "readyz", "metrics", "docs", "openapi"];

/// The method and path of a covered operation, its `{id}` filled in.
pub(crate) fn route(operation: &str, id: Option<&str>) -> (&'static str, String) {
    let (_, method, template) =
        COVERED.iter().find(|(name, _, _)| *name == operation).copied().unwrap_or((operation, "GET", "/"));
    (method, id.map_or_else(|| template.to_owned(), |id| template.replace("{id}", id)))
}
