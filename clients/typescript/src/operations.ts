// Every operation of openapi.yaml, by its operationId: those the client covers (with their method
// and path), and those a merchant never calls. A test fails when openapi.yaml gains one in neither.

export const COVERED: ReadonlyArray<readonly [operationId: string, method: string, path: string]> = [
  ["createOrder", "POST", "/orders"],
  ["listOrders", "GET", "/orders"],
  ["getOrder", "GET", "/orders/{id}"],
  ["cancelOrder", "POST", "/orders/{id}/cancel"],
  ["createPayment", "POST", "/payments"],
  ["listPayments", "GET", "/payments"],
  ["getPayment", "GET", "/payments/{id}"],
  ["capturePayment", "POST", "/payments/{id}/capture"],
  ["voidPayment", "POST", "/payments/{id}/void"],
  ["createRefund", "POST", "/refunds"],
  ["listRefunds", "GET", "/refunds"],
  ["getRefund", "GET", "/refunds/{id}"],
  ["listBalanceTransactions", "GET", "/balance_transactions"],
  ["listDisputes", "GET", "/disputes"],
  ["getDispute", "GET", "/disputes/{id}"],
  ["submitDisputeEvidence", "POST", "/disputes/{id}/evidence"],
  ["acceptDispute", "POST", "/disputes/{id}/accept"],
  ["listEvents", "GET", "/events"],
  ["getEvent", "GET", "/events/{id}"],
  ["createWebhookEndpoint", "POST", "/webhook_endpoints"],
  ["listWebhookEndpoints", "GET", "/webhook_endpoints"],
  ["getWebhookEndpoint", "GET", "/webhook_endpoints/{id}"],
  ["deleteWebhookEndpoint", "DELETE", "/webhook_endpoints/{id}"],
  ["rotateWebhookEndpointSecret", "POST", "/webhook_endpoints/{id}/rotate_secret"],
];

/** The provider's webhooks, health, metrics and the docs: not a merchant's calls. */
export const EXCLUDED: ReadonlyArray<string> = ["receiveProviderWebhook", "healthz", "readyz", "metrics", "docs", "openapi"];
