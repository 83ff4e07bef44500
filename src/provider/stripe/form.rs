//! The form bodies of Stripe's writes (`application/x-www-form-urlencoded`, Stripe's only request
//! encoding), built from the provider trait's requests, and the headers every write carries.
//! Nested fields are written the way Stripe reads them: `metadata[key]` for a hash,
//! `payment_method_types[]` for a list.

use uuid::Uuid;

use super::amount::{MinorUnitsError, to_minor_units};
use crate::money::Amount;
use crate::provider::{CaptureRequest, ChargeRequest, RefundRequest};

/// The API version every call names (`Stripe-Version`), so that an upgrade of the account's
/// default version in Stripe's dashboard changes nothing here: the first version of the
/// "clover" release, whose objects and errors this adapter is written against.
pub const STRIPE_VERSION: &str = "2025-09-30.clover";

/// The metadata key that names our payment on its PaymentIntent: what a lookup by listing
/// PaymentIntents will search for.
pub const PAYMENT_ID_METADATA: &str = "orderpay_payment_id";
/// The metadata key that names our refund on Stripe's refund.
pub const REFUND_ID_METADATA: &str = "orderpay_refund_id";

/// A form body: its fields in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Form {
    fields: Vec<(String, String)>,
}

impl Form {
    fn field(mut self, name: &str, value: impl Into<String>) -> Self {
        self.fields.push((name.to_owned(), value.into()));
        self
    }

    /// `amount` in Stripe's minor units and `currency` in lower case, as Stripe requires.
    fn money(self, amount: &Amount) -> Result<Self, MinorUnitsError> {
        let minor_units = to_minor_units(amount)?;
        Ok(self
            .field("amount", minor_units.to_string())
            .field("currency", amount.currency().code().to_ascii_lowercase()))
    }

    fn metadata(self, key: &str, id: Uuid) -> Self {
        self.field(&format!("metadata[{key}]"), id.to_string())
    }

    /// Asks Stripe to answer with the object at `path` expanded (`expand[]`).
    pub fn expand(self, path: &str) -> Self {
        self.field("expand[]", path)
    }

    pub fn fields(&self) -> &[(String, String)] {
        &self.fields
    }

    /// The body as sent, percent-encoded.
    pub fn encode(&self) -> String {
        url::form_urlencoded::Serializer::new(String::new()).extend_pairs(&self.fields).finish()
    }
}

/// `POST /v1/payment_intents`, created and confirmed in one call with the card payment method
/// the charge names: captured at once (`automatic`) or only authorized (`manual`).
pub fn create_payment_intent(request: &ChargeRequest) -> Result<Form, MinorUnitsError> {
    let capture_method = if request.capture { "automatic" } else { "manual" };
    Ok(Form::default()
        .money(&request.amount)?
        .field("confirm", "true")
        .field("payment_method", request.payment_method.clone())
        .field("payment_method_types[]", "card")
        .field("capture_method", capture_method)
        .metadata(PAYMENT_ID_METADATA, request.reference))
}

/// `POST /v1/payment_intents/{id}/capture`: all of the authorization, or `amount_to_capture`
/// of it (Stripe releases the rest).
pub fn capture_payment_intent(request: &CaptureRequest) -> Result<Form, MinorUnitsError> {
    match &request.amount {
        None => Ok(Form::default()),
        Some(amount) => Ok(Form::default().field("amount_to_capture", to_minor_units(amount)?.to_string())),
    }
}

/// `POST /v1/disputes/{id}` with our text evidence, submitted at once (Stripe's disputes take
/// evidence field by field; orderpay's is one text).
pub fn submit_evidence(evidence: &str) -> Form {
    Form::default().field("evidence[uncategorized_text]", evidence).field("submit", "true")
}

/// `POST /v1/refunds` of part or all of the PaymentIntent `request.charge_id` names.
pub fn create_refund(request: &RefundRequest) -> Result<Form, MinorUnitsError> {
    // The refund's currency is its PaymentIntent's: Stripe takes no `currency` here.
    let amount = to_minor_units(&request.amount)?;
    Ok(Form::default()
        .field("payment_intent", request.charge_id.clone())
        .field("amount", amount.to_string())
        .metadata(REFUND_ID_METADATA, request.reference))
}

/// The headers of a write besides the credential: our downstream key as Stripe's
/// `Idempotency-Key` (a re-driven call is the same operation at Stripe, never a second one), and
/// the pinned version.
pub fn write_headers(downstream_key: &str) -> [(&'static str, String); 2] {
    [("Idempotency-Key", downstream_key.to_owned()), ("Stripe-Version", STRIPE_VERSION.to_owned())]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::money::Currency;

    const PAYMENT: Uuid = Uuid::from_u128(0x0190_0000_0000_7000_8000_0000_0000_0001);

    fn charge(amount: &str, code: &str, capture: bool) -> ChargeRequest {
        ChargeRequest {
            downstream_key: "pay_key_1".into(),
            amount: Amount::parse(amount, Currency::parse(code).unwrap()).unwrap(),
            payment_method: "pm_card_visa".into(),
            reference: PAYMENT,
            capture,
            request_id: None,
        }
    }

    fn pairs(form: &Form) -> Vec<(&str, &str)> {
        form.fields().iter().map(|(name, value)| (name.as_str(), value.as_str())).collect()
    }

    #[test]
    fn a_charge_is_a_confirmed_card_payment_intent_in_minor_units_and_lower_case() {
        let form = create_payment_intent(&charge("12.34", "EUR", true)).unwrap();
        assert_eq!(
            pairs(&form),
            [
                ("amount", "1234"),
                ("currency", "eur"),
                ("confirm", "true"),
                ("payment_method", "pm_card_visa"),
                ("payment_method_types[]", "card"),
                ("capture_method", "automatic"),
                ("metadata[orderpay_payment_id]", "01900000-0000-7000-8000-000000000001"),
            ]
        );
        assert_eq!(
            form.encode(),
            "amount=1234&currency=eur&confirm=true&payment_method=pm_card_visa&payment_method_types%5B%5D=card\
             &capture_method=automatic&metadata%5Borderpay_payment_id%5D=01900000-0000-7000-8000-000000000001"
        );
    }

    #[test]
    fn an_authorization_only_is_captured_manually() {
        let form = create_payment_intent(&charge("500", "JPY", false)).unwrap();
        let fields = pairs(&form);
        assert!(fields.contains(&("capture_method", "manual")), "{fields:?}");
        assert!(fields.contains(&("amount", "500")) && fields.contains(&("currency", "jpy")), "{fields:?}");
    }

    #[test]
    fn an_amount_stripe_cannot_take_builds_no_form() {
        let refused = create_payment_intent(&charge("5.124", "KWD", true)).unwrap_err();
        assert!(matches!(refused, MinorUnitsError::NotRepresentable { currency: "KWD", .. }), "{refused}");
    }

    #[test]
    fn a_refund_names_its_payment_intent_amount_and_our_refund() {
        let refund = RefundRequest {
            charge_id: "pi_3Abc".into(),
            downstream_key: "refund_key_1".into(),
            amount: Amount::parse("5", Currency::parse("ISK").unwrap()).unwrap(),
            reference: PAYMENT,
            request_id: None,
        };
        assert_eq!(
            pairs(&create_refund(&refund).unwrap()),
            [
                ("payment_intent", "pi_3Abc"),
                ("amount", "500"),
                ("metadata[orderpay_refund_id]", "01900000-0000-7000-8000-000000000001"),
            ]
        );
    }

    #[test]
    fn a_partial_capture_names_its_amount_in_minor_units_and_a_full_one_nothing() {
        let capture = |amount: Option<&str>| CaptureRequest {
            charge_id: "pi_1".into(),
            downstream_key: "capture_key_1".into(),
            amount: amount.map(|amount| Amount::parse(amount, Currency::parse("USD").unwrap()).unwrap()),
            request_id: None,
        };
        assert_eq!(pairs(&capture_payment_intent(&capture(None)).unwrap()), []);
        let partial = capture_payment_intent(&capture(Some("4.50"))).unwrap().expand("latest_charge");
        assert_eq!(pairs(&partial), [("amount_to_capture", "450"), ("expand[]", "latest_charge")]);
        assert_eq!(
            submit_evidence("a receipt & a photo").encode(),
            "evidence%5Buncategorized_text%5D=a+receipt+%26+a+photo&submit=true"
        );
    }

    #[test]
    fn writes_carry_our_key_and_the_pinned_version() {
        assert_eq!(
            write_headers("pay_key_1"),
            [("Idempotency-Key", "pay_key_1".to_owned()), ("Stripe-Version", "2025-09-30.clover".to_owned())]
        );
    }
}
