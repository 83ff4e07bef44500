//! Amounts as Stripe writes them: an integer count of the currency's smallest unit *as Stripe
//! counts it*, which is not always ISO 4217's (docs/providers.md, "Minor units"). What Stripe's
//! currency documentation says, and this table follows:
//!
//! - two decimals unless listed otherwise (USD 10.00 is `1000`);
//! - zero-decimal: BIF CLP DJF GNF JPY KMF KRW MGA PYG RWF UGX VND VUV XAF XOF XPF (JPY 500 is
//!   `500`);
//! - three-decimal: BHD JOD KWD OMR TND, and the last digit must be 0 (KWD 5.120 is `5120`;
//!   5.124 cannot be sent, and we refuse it rather than round someone's money);
//! - ISK: zero-decimal in ISO 4217 and in practice, but two-decimal in Stripe's API for backward
//!   compatibility, with amounts a multiple of 100 (ISK 5 is `500`);
//! - HUF and TWD: two-decimal for charges; only payouts must be whole units, which orderpay does
//!   not make.
//!
//! A currency missing from the table is refused, not guessed: a factor of 100 off is the worst
//! mistake a payment integration can make.

use rust_decimal::Decimal;

use crate::error::{ApiError, FieldError};
use crate::money::{Amount, AmountError, Currency};

/// How Stripe counts one currency: `decimals` places in its integer amounts, every amount a
/// multiple of `step` of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Exponent {
    decimals: u32,
    step: i64,
}

const ZERO_DECIMAL: Exponent = Exponent { decimals: 0, step: 1 };
const TWO_DECIMAL: Exponent = Exponent { decimals: 2, step: 1 };
/// Stripe's partners need the last digit of a three-decimal amount to be 0.
const THREE_DECIMAL: Exponent = Exponent { decimals: 3, step: 10 };
/// Two decimals on the wire, whole units only.
const WHOLE_UNITS_IN_HUNDREDTHS: Exponent = Exponent { decimals: 2, step: 100 };

const ZERO_DECIMAL_CODES: &[&str] = &[
    "BIF", "CLP", "DJF", "GNF", "JPY", "KMF", "KRW", "MGA", "PYG", "RWF", "UGX", "VND", "VUV", "XAF", "XOF",
    "XPF",
];
const THREE_DECIMAL_CODES: &[&str] = &["BHD", "JOD", "KWD", "OMR", "TND"];
/// The two-decimal currencies Stripe charges in that orderpay accepts (HUF and TWD among them:
/// their whole-unit rule is for payouts only).
const TWO_DECIMAL_CODES: &[&str] = &[
    "AED", "ARS", "AUD", "BRL", "CAD", "CHF", "CNY", "COP", "CZK", "DKK", "EGP", "EUR", "GBP", "HKD", "HUF",
    "IDR", "ILS", "INR", "MXN", "MYR", "NGN", "NOK", "NZD", "PEN", "PHP", "PKR", "PLN", "QAR", "RON", "SAR",
    "SEK", "SGD", "THB", "TRY", "TWD", "UAH", "USD", "UYU", "ZAR",
];

fn exponent(code: &str) -> Option<Exponent> {
    let listed = |codes: &[&str]| codes.contains(&code);
    if code == "ISK" {
        Some(WHOLE_UNITS_IN_HUNDREDTHS)
    } else if listed(ZERO_DECIMAL_CODES) {
        Some(ZERO_DECIMAL)
    } else if listed(THREE_DECIMAL_CODES) {
        Some(THREE_DECIMAL)
    } else if listed(TWO_DECIMAL_CODES) {
        Some(TWO_DECIMAL)
    } else {
        None
    }
}

/// Why an amount cannot cross to or from Stripe.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MinorUnitsError {
    #[error("currency {0} is not one orderpay knows how Stripe counts")]
    UnknownCurrency(String),
    #[error(
        "{amount} {currency} cannot be charged through Stripe: amounts in {currency} must be a multiple of {step}"
    )]
    NotRepresentable { amount: Decimal, currency: &'static str, step: Decimal },
    #[error("{amount} {currency} is too large for Stripe's integer amounts")]
    TooLarge { amount: Decimal, currency: &'static str },
    #[error("Stripe's amount {minor_units} in {currency} is not an amount orderpay can hold: {reason}")]
    Unreadable { minor_units: i64, currency: &'static str, reason: AmountError },
}

/// An amount Stripe cannot take is the client's request to fix: 422 `validation-failed`, on the
/// field that carries it.
impl From<MinorUnitsError> for ApiError {
    fn from(error: MinorUnitsError) -> ApiError {
        ApiError::Validation(vec![FieldError::new("amount", error)])
    }
}

fn exponent_of(currency: Currency) -> Result<Exponent, MinorUnitsError> {
    exponent(currency.code()).ok_or_else(|| MinorUnitsError::UnknownCurrency(currency.code().to_owned()))
}

/// The integer `amount` Stripe expects for `amount`.
pub fn to_minor_units(amount: &Amount) -> Result<i64, MinorUnitsError> {
    let currency = amount.currency();
    let exponent = exponent_of(currency)?;
    let value = amount.value();
    let too_large = || MinorUnitsError::TooLarge { amount: value, currency: currency.code() };
    let scaled = value.checked_mul(Decimal::from(10_i64.pow(exponent.decimals))).ok_or_else(too_large)?;
    let not_representable = || MinorUnitsError::NotRepresentable {
        amount: value,
        currency: currency.code(),
        step: Decimal::new(exponent.step, exponent.decimals).normalize(),
    };
    // Finer than Stripe's unit: cannot be sent as an integer at all.
    if !scaled.fract().is_zero() {
        return Err(not_representable());
    }
    let minor_units = i64::try_from(scaled.trunc()).map_err(|_| too_large())?;
    if minor_units % exponent.step != 0 {
        return Err(not_representable());
    }
    Ok(minor_units)
}

/// The [`Amount`] Stripe means by the integer `minor_units` in `currency`. Refused when it is
/// negative or finer than orderpay's minor unit for the currency (ISK 1.50 is `150` to Stripe
/// but not an amount orderpay holds).
pub fn from_minor_units(minor_units: i64, currency: Currency) -> Result<Amount, MinorUnitsError> {
    let exponent = exponent_of(currency)?;
    Amount::from_decimal(Decimal::new(minor_units, exponent.decimals), currency)
        .map_err(|reason| MinorUnitsError::Unreadable { minor_units, currency: currency.code(), reason })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn amount(text: &str, code: &str) -> Amount {
        Amount::parse(text, Currency::parse(code).unwrap()).unwrap()
    }

    fn to_stripe(text: &str, code: &str) -> Result<i64, MinorUnitsError> {
        to_minor_units(&amount(text, code))
    }

    fn from_stripe(minor_units: i64, code: &str) -> Result<String, MinorUnitsError> {
        from_minor_units(minor_units, Currency::parse(code).unwrap()).map(|amount| amount.to_string())
    }

    /// Our amount, its currency, and Stripe's integer for it: each converts to the integer and
    /// back to the same amount. Two decimals (hundredths); zero-decimal (as they are); three
    /// decimals (thousandths, the last digit 0); ISK (whole krónur in hundredths); HUF and TWD
    /// (hundredths, decimals allowed for charges).
    // One line per kind of currency.
    #[rustfmt::skip]
    const BOTH_WAYS: &[(&str, &str, i64)] = &[
        ("10", "USD", 1000), ("12.34", "EUR", 1234), ("0.01", "GBP", 1), ("0", "USD", 0),
        ("500", "JPY", 500), ("1500", "KRW", 1500), ("990", "CLP", 990),
        ("5.12", "KWD", 5120), ("1", "BHD", 1000),
        ("5", "ISK", 500), ("1200", "ISK", 120_000),
        ("10.45", "HUF", 1045), ("99.99", "TWD", 9999),
    ];

    #[test]
    fn amounts_cross_both_ways_as_stripe_counts_each_currency() {
        for &(text, code, minor_units) in BOTH_WAYS {
            let ours = amount(text, code);
            assert_eq!(to_minor_units(&ours), Ok(minor_units), "{text} {code}");
            assert_eq!(from_minor_units(minor_units, ours.currency()), Ok(ours), "{minor_units} {code}");
        }
        // Stripe's zero-decimal list holds currencies orderpay does not accept yet.
        assert_eq!(exponent("UGX"), Some(ZERO_DECIMAL));
        assert_eq!(exponent("XOF"), Some(ZERO_DECIMAL));
    }

    #[test]
    fn three_decimal_amounts_whose_last_digit_is_not_zero_cannot_be_sent() {
        let refused = to_stripe("5.124", "KWD").unwrap_err();
        assert_eq!(
            refused,
            MinorUnitsError::NotRepresentable {
                amount: Decimal::new(5124, 3),
                currency: "KWD",
                step: Decimal::new(1, 2)
            }
        );
        assert_eq!(
            refused.to_string(),
            "5.124 KWD cannot be charged through Stripe: amounts in KWD must be a multiple of 0.01"
        );
        // Stripe never sends one, but if it did, 5.125 is still an exact OMR amount.
        assert_eq!(from_stripe(5125, "OMR"), Ok("5.125".to_owned()));
    }

    #[test]
    fn fractional_kronur_from_stripe_are_not_an_amount_orderpay_holds() {
        let fractional = from_stripe(150, "ISK").unwrap_err();
        assert!(
            matches!(fractional, MinorUnitsError::Unreadable { minor_units: 150, currency: "ISK", .. }),
            "{fractional}"
        );
    }

    #[test]
    fn every_currency_orderpay_accepts_is_in_stripes_table_at_a_precision_that_holds_it() {
        for currency in Currency::supported() {
            let exponent = exponent(currency.code())
                .unwrap_or_else(|| panic!("{} has no Stripe exponent", currency.code()));
            // Our finest amount must be sendable: one minor unit of ours is whole in Stripe's count.
            let one_unit = Decimal::new(1, currency.minor_units());
            let smallest = Amount::from_decimal(one_unit, currency).unwrap();
            match to_minor_units(&smallest) {
                Ok(minor_units) => assert_eq!(minor_units % exponent.step, 0, "{}", currency.code()),
                // Only the three-decimal currencies' last digit is out of reach.
                Err(error) => assert_eq!(exponent, THREE_DECIMAL, "{}: {error}", currency.code()),
            }
        }
    }

    #[test]
    fn a_currency_outside_the_table_and_amounts_out_of_range_are_refused() {
        assert_eq!(exponent("XXX"), None);
        assert_eq!(exponent("usd"), None, "codes are compared as orderpay writes them, upper case");
        let negative = from_stripe(-100, "USD").unwrap_err();
        assert!(
            matches!(negative, MinorUnitsError::Unreadable { reason: AmountError::Negative, .. }),
            "{negative}"
        );
        let too_large = from_stripe(i64::MAX, "JPY").unwrap_err();
        assert!(
            matches!(too_large, MinorUnitsError::Unreadable { reason: AmountError::TooLarge, .. }),
            "{too_large}"
        );
        assert_eq!(to_stripe("999999999999999", "KWD"), Ok(999_999_999_999_999_000));
    }

    #[test]
    fn an_amount_stripe_cannot_take_is_a_validation_failure_of_the_amount() {
        let error = ApiError::from(to_stripe("5.124", "KWD").unwrap_err());
        let ApiError::Validation(fields) = error else { panic!("not a validation failure: {error:?}") };
        assert_eq!(fields.len(), 1);
        assert_eq!(fields[0].field, "amount");
        assert!(fields[0].message.contains("multiple of 0.01"), "{}", fields[0].message);
    }
}
