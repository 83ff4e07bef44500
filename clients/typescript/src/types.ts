// The API's requests and resources, generated from openapi.yaml by openapi-typescript. Money is
// a decimal string ("19.99"), never a number.

import type { components } from "./openapi.js";

type Schemas = components["schemas"];

/** An exact amount: a decimal string with the currency's minor units ("19.99", "1200" in JPY). */
export type Money = string;

/** The API also reads a JSON number as its exact text; this client sends strings only. */
type WithMoney<T, K extends keyof T> = Omit<T, K> & { [P in K]?: Money | null };

export type Order = Schemas["Order"];
export type OrderItem = Schemas["OrderItem"];
export type OrderItemRequest = Omit<Schemas["OrderItemRequest"], "unit_price"> & { unit_price: Money };
export type CreateOrder = Omit<Schemas["CreateOrderRequest"], "items"> & { items: OrderItemRequest[] };
export type Payment = Schemas["Payment"];
export type CreatePayment = WithMoney<Schemas["CreatePaymentRequest"], "amount">;
export type Capture = WithMoney<Schemas["CaptureRequest"], "amount">;
export type Refund = Schemas["Refund"];
export type CreateRefund = WithMoney<Schemas["CreateRefundRequest"], "amount">;
export type BalanceTransaction = Schemas["BalanceTransaction"];
export type Dispute = Schemas["Dispute"];
export type DisputeEvidence = Schemas["DisputeEvidenceRequest"];
export type Event = Schemas["Event"];
export type EventType = Schemas["EventType"];
export type WebhookEndpoint = Schemas["WebhookEndpoint"];
export type WebhookEndpointWithSecret = Schemas["WebhookEndpointWithSecret"];
export type CreateWebhookEndpoint = Schemas["CreateWebhookEndpointRequest"];
export type DeletedWebhookEndpoint = Schemas["DeletedWebhookEndpoint"];

/** A page of a list, newest first. */
export interface List<T> {
  object: "list";
  data: T[];
  has_more: boolean;
}

/** A list's query: a page size (1 to 100), a cursor (the id the page starts after), filters. */
export interface ListParams {
  limit?: number;
  starting_after?: string;
}
export interface PaymentListParams extends ListParams {
  order_id?: string;
  status?: Payment["status"];
}
export interface RefundListParams extends ListParams {
  payment_id?: string;
}
export interface BalanceTransactionListParams extends ListParams {
  payment_id?: string;
  order_id?: string;
  type?: Schemas["BalanceTransactionType"];
}
export interface DisputeListParams extends ListParams {
  status?: Schemas["DisputeStatus"];
  payment_id?: string;
  /** Only disputes that need a response whose evidence is due before this time (RFC 3339). */
  due_before?: string;
}
export interface EventListParams extends ListParams {
  type?: EventType;
}
