//! Money: ISO 4217 currencies and exact decimal amounts.
//!
//! Amounts are [`rust_decimal::Decimal`] from the request text to the database and back; nothing
//! here ever touches a float. An [`Amount`] is only built by parsing (or by checked arithmetic on
//! amounts), so it is always non-negative, within [`Amount::MAX`] and never finer than its
//! currency's minor unit.
//!
//! # Amounts in requests
//!
//! The text of an amount (a JSON string, or a JSON number read as its exact text) must match
//! openapi.yaml's `^[0-9]+(\.[0-9]+)?$`: digits, optionally a point and more digits. No sign
//! (not even `-0`), no exponent (`1e2`), no spaces, separators or special values. rust_decimal's
//! own parser is more lenient (underscores, a leading `+`), which an API must not be.
//!
//! Trailing zeros are normalised, not refused: they do not change the value, so `"1.000"` is
//! 1.00 in USD and `"12.0"` is 12 in JPY. Only a non-zero digit past the currency's minor unit
//! is refused, as too precise for that currency. (The idempotency fingerprint still compares
//! the text as written: `"1.000"` and `"1.00"` are two different request bodies.)
//!
//! Each refusal names its real problem: malformed text, a negative value, more decimal places
//! than the currency allows, or more than [`Amount::MAX`].

use std::fmt;
use std::str::FromStr;

use rust_decimal::Decimal;

/// An ISO 4217 alphabetic currency code that orderpay accepts, with its minor unit. Stored as
/// its code (`text`); a stored code that no longer parses is a corrupt row, reported by diesel
/// as a deserialization error like any other.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, diesel::expression::AsExpression, diesel::deserialize::FromSqlRow,
)]
#[diesel(sql_type = diesel::sql_types::Text)]
pub struct Currency {
    code: &'static str,
    minor_units: u32,
}

/// Supported currencies and their minor units (ISO 4217). A currency missing here is refused
/// rather than guessed: charging in the wrong precision is worse than not charging.
const CURRENCIES: &[(&str, u32)] = &[
    ("AED", 2),
    ("ARS", 2),
    ("AUD", 2),
    ("BHD", 3),
    ("BRL", 2),
    ("CAD", 2),
    ("CHF", 2),
    ("CLP", 0),
    ("CNY", 2),
    ("COP", 2),
    ("CZK", 2),
    ("DKK", 2),
    ("EGP", 2),
    ("EUR", 2),
    ("GBP", 2),
    ("HKD", 2),
    ("HUF", 2),
    ("IDR", 2),
    ("ILS", 2),
    ("INR", 2),
    ("ISK", 0),
    ("JOD", 3),
    ("JPY", 0),
    ("KRW", 0),
    ("KWD", 3),
    ("MXN", 2),
    ("MYR", 2),
    ("NGN", 2),
    ("NOK", 2),
    ("NZD", 2),
    ("OMR", 3),
    ("PEN", 2),
    ("PHP", 2),
    ("PKR", 2),
    ("PLN", 2),
    ("QAR", 2),
    ("RON", 2),
    ("SAR", 2),
    ("SEK", 2),
    ("SGD", 2),
    ("THB", 2),
    ("TND", 3),
    ("TRY", 2),
    ("TWD", 2),
    ("UAH", 2),
    ("USD", 2),
    ("UYU", 2),
    ("VND", 0),
    ("ZAR", 2),
];

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CurrencyError {
    #[error("must be a three-letter ISO 4217 code such as \"USD\"")]
    Malformed,
    #[error("currency {0} is not supported")]
    Unsupported(String),
}

impl Currency {
    /// Parses an ISO 4217 code. Lower case is accepted (as Stripe sends it) and normalised.
    pub fn parse(input: &str) -> Result<Self, CurrencyError> {
        if input.len() != 3 || !input.bytes().all(|b| b.is_ascii_alphabetic()) {
            return Err(CurrencyError::Malformed);
        }
        let code = input.to_ascii_uppercase();
        CURRENCIES
            .iter()
            .find(|(known, _)| *known == code)
            .map(|&(code, minor_units)| Currency { code, minor_units })
            .ok_or(CurrencyError::Unsupported(code))
    }

    /// Every currency orderpay accepts, in code order.
    pub fn supported() -> impl Iterator<Item = Currency> {
        CURRENCIES.iter().map(|&(code, minor_units)| Currency { code, minor_units })
    }

    pub fn code(&self) -> &'static str {
        self.code
    }

    /// Decimal places of the currency's minor unit: 2 for USD, 0 for JPY, 3 for KWD.
    pub fn minor_units(&self) -> u32 {
        self.minor_units
    }
}

impl fmt::Display for Currency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.code)
    }
}

impl FromStr for Currency {
    type Err = CurrencyError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Currency::parse(s)
    }
}

impl serde::Serialize for Currency {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.code)
    }
}

impl diesel::serialize::ToSql<diesel::sql_types::Text, diesel::pg::Pg> for Currency {
    fn to_sql<'b>(
        &'b self,
        out: &mut diesel::serialize::Output<'b, '_, diesel::pg::Pg>,
    ) -> diesel::serialize::Result {
        <str as diesel::serialize::ToSql<diesel::sql_types::Text, diesel::pg::Pg>>::to_sql(self.code, out)
    }
}

impl diesel::deserialize::FromSql<diesel::sql_types::Text, diesel::pg::Pg> for Currency {
    fn from_sql(bytes: diesel::pg::PgValue<'_>) -> diesel::deserialize::Result<Self> {
        let code =
            <String as diesel::deserialize::FromSql<diesel::sql_types::Text, diesel::pg::Pg>>::from_sql(
                bytes,
            )?;
        Ok(Currency::parse(&code).map_err(|error| format!("stored currency {code:?}: {error}"))?)
    }
}

/// A non-negative amount of money in a known currency, exact to the currency's minor unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Amount {
    value: Decimal,
    currency: Currency,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AmountError {
    #[error(
        "must be a decimal string such as \"12.50\": digits and an optional decimal point, with no sign and no exponent"
    )]
    Malformed,
    #[error("must not be negative")]
    Negative,
    #[error("has more decimal places than {currency} allows ({minor_units})")]
    TooPrecise { currency: &'static str, minor_units: u32 },
    #[error("exceeds the maximum amount of {}", Amount::MAX)]
    TooLarge,
}

/// The finest minor unit of any supported currency (BHD, JOD, KWD, OMR, TND: 3 decimals).
pub const MAX_MINOR_UNITS: u32 = 3;

impl Amount {
    /// The largest amount orderpay handles, in major units: far above any real order, far below
    /// what NUMERIC(19,4) or the decimal type could overflow on.
    pub const MAX: Decimal = Decimal::from_parts(2_764_472_319, 232_830, 0, false, 0); // 999_999_999_999_999

    pub fn zero(currency: Currency) -> Self {
        Amount { value: Decimal::ZERO, currency }
    }

    /// Parses an amount as a client writes it (the grammar is in the module documentation). The
    /// value must be within the currency's minor unit: `"12.5"` and `"12.500"` are 12.50 in USD,
    /// `"12.505"` is refused as too precise for USD.
    pub fn parse(text: &str, currency: Currency) -> Result<Self, AmountError> {
        let value = Digits::parse(text)?.value(currency.minor_units, currency.code)?;
        Self::from_decimal(value, currency)
    }

    /// Wraps a decimal that came from our own database or arithmetic, checking the same rules.
    pub fn from_decimal(value: Decimal, currency: Currency) -> Result<Self, AmountError> {
        if value.is_sign_negative() && !value.is_zero() {
            return Err(AmountError::Negative);
        }
        if value > Self::MAX {
            return Err(AmountError::TooLarge);
        }
        let value = value.normalize();
        if value.scale() > currency.minor_units {
            return Err(AmountError::TooPrecise {
                currency: currency.code,
                minor_units: currency.minor_units,
            });
        }
        // `normalize` keeps a negative zero's sign; an amount of zero is plain zero.
        let value = if value.is_zero() { Decimal::ZERO } else { value };
        Ok(Amount { value, currency })
    }

    pub fn value(&self) -> Decimal {
        self.value
    }

    pub fn currency(&self) -> Currency {
        self.currency
    }

    /// `self * quantity`, refused (not wrapped, not panicking) past [`Amount::MAX`].
    pub fn checked_mul(&self, quantity: u32) -> Result<Self, AmountError> {
        let value = self.value.checked_mul(Decimal::from(quantity)).ok_or(AmountError::TooLarge)?;
        Self::from_decimal(value, self.currency)
    }

    /// `self + other` in the same currency, refused past [`Amount::MAX`].
    pub fn checked_add(&self, other: &Amount) -> Result<Self, AmountError> {
        debug_assert_eq!(self.currency, other.currency, "adding amounts in two currencies");
        let value = self.value.checked_add(other.value).ok_or(AmountError::TooLarge)?;
        Self::from_decimal(value, self.currency)
    }
}

/// Formats with exactly the currency's minor units, the way the API prints money:
/// `12.50` for USD, `1200` for JPY.
impl fmt::Display for Amount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut value = self.value;
        value.rescale(self.currency.minor_units);
        write!(f, "{value}")
    }
}

impl serde::Serialize for Amount {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// Parses the value of an amount whose currency is not known yet (a payment's `amount` guard,
/// compared with the order's total once the order is loaded): the grammar and limits of
/// [`Amount::parse`] (see the module documentation), with the finest minor unit of any supported
/// currency.
pub fn parse_value(text: &str) -> Result<Decimal, AmountError> {
    let value = Digits::parse(text)?.value(MAX_MINOR_UNITS, "any supported currency")?;
    if value > Amount::MAX {
        return Err(AmountError::TooLarge);
    }
    Ok(value)
}

/// The significant digits of an amount's text: the integer part without its leading zeros and
/// the fraction without its trailing zeros (neither changes the value).
#[derive(Debug)]
struct Digits<'a> {
    integer: &'a str,
    fraction: &'a str,
}

/// Digits in [`Amount::MAX`]'s integer part.
const MAX_INTEGER_DIGITS: usize = 15;

fn all_digits(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit())
}

impl<'a> Digits<'a> {
    fn parse(text: &'a str) -> Result<Self, AmountError> {
        if let Some(unsigned) = text.strip_prefix('-') {
            // No sign is ever allowed; call it negative only when it is a number below zero, in
            // any JSON number form (`-5`, `-1e400`). `-0` is malformed, not negative.
            return Err(if is_nonzero_json_number(unsigned) {
                AmountError::Negative
            } else {
                AmountError::Malformed
            });
        }
        let (integer, fraction) = match text.split_once('.') {
            Some((integer, fraction)) => (integer, Some(fraction)),
            None => (text, None),
        };
        if !all_digits(integer) || fraction.is_some_and(|fraction| !all_digits(fraction)) {
            return Err(AmountError::Malformed);
        }
        let integer = integer.trim_start_matches('0');
        if integer.len() > MAX_INTEGER_DIGITS {
            return Err(AmountError::TooLarge);
        }
        Ok(Digits { integer, fraction: fraction.unwrap_or("").trim_end_matches('0') })
    }

    /// The exact value, refused when it has more decimal places than `minor_units`.
    fn value(&self, minor_units: u32, currency: &'static str) -> Result<Decimal, AmountError> {
        if self.fraction.len() > minor_units as usize {
            return Err(AmountError::TooPrecise { currency, minor_units });
        }
        // At most 15 + 3 digits: the mantissa fits an i64 with room to spare.
        let mantissa = self
            .integer
            .bytes()
            .chain(self.fraction.bytes())
            .fold(0_i64, |mantissa, digit| mantissa * 10 + i64::from(digit - b'0'));
        Ok(Decimal::new(mantissa, self.fraction.len() as u32))
    }
}

/// JSON's number grammar without the sign (`5`, `1.5`, `1e400`), with a non-zero digit before
/// any exponent.
fn is_nonzero_json_number(text: &str) -> bool {
    let (mantissa, exponent) = match text.find(['e', 'E']) {
        Some(at) => (&text[..at], Some(&text[at + 1..])),
        None => (text, None),
    };
    let (integer, fraction) = match mantissa.split_once('.') {
        Some((integer, fraction)) => (integer, Some(fraction)),
        None => (mantissa, None),
    };
    let well_formed = all_digits(integer)
        && fraction.is_none_or(all_digits)
        && exponent.is_none_or(|exponent| all_digits(exponent.strip_prefix(['-', '+']).unwrap_or(exponent)));
    well_formed && mantissa.bytes().any(|b| (b'1'..=b'9').contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usd() -> Currency {
        Currency::parse("USD").unwrap()
    }

    #[test]
    fn max_constant_is_what_it_says() {
        assert_eq!(Amount::MAX, Decimal::from(999_999_999_999_999_u64));
    }

    #[test]
    fn currencies_parse_case_insensitively_and_know_their_minor_units() {
        assert_eq!(Currency::parse("usd").unwrap().code(), "USD");
        assert_eq!(Currency::parse("JPY").unwrap().minor_units(), 0);
        assert_eq!(Currency::parse("KWD").unwrap().minor_units(), 3);
        assert_eq!(Currency::parse("US"), Err(CurrencyError::Malformed));
        assert_eq!(Currency::parse("U$D"), Err(CurrencyError::Malformed));
        assert_eq!(Currency::parse("XXX"), Err(CurrencyError::Unsupported("XXX".into())));
    }

    #[test]
    fn amounts_parse_exactly_and_print_in_minor_units() {
        let cases = [
            ("12.5", "12.50"),
            ("0", "0.00"),
            ("0.10", "0.10"),
            ("007.5", "7.50"),
            ("999999999999999", "999999999999999.00"),
            // Trailing zeros are normalised, whatever their number.
            ("100.000", "100.00"),
            ("1.000", "1.00"),
        ];
        for (input, printed) in cases {
            assert_eq!(Amount::parse(input, usd()).unwrap().to_string(), printed, "{input}");
        }
        let long_zeros = format!("2.5{}", "0".repeat(1000));
        assert_eq!(Amount::parse(&long_zeros, usd()).unwrap().to_string(), "2.50");
        let jpy = Currency::parse("JPY").unwrap();
        assert_eq!(Amount::parse("1200", jpy).unwrap().to_string(), "1200");
        assert_eq!(Amount::parse("12.0", jpy).unwrap().to_string(), "12");
        assert_eq!(Amount::parse("1200.000", jpy).unwrap().to_string(), "1200");
    }

    #[test]
    fn bad_amounts_are_refused_with_their_real_reason() {
        let jpy = Currency::parse("JPY").unwrap();
        assert_eq!(
            Amount::parse("1.5", jpy).unwrap_err(),
            AmountError::TooPrecise { currency: "JPY", minor_units: 0 }
        );
        let too_precise = AmountError::TooPrecise { currency: "USD", minor_units: 2 };
        assert_eq!(Amount::parse("0.001", usd()), Err(too_precise.clone()));
        let tiny = format!("0.{}1", "0".repeat(1000));
        assert_eq!(Amount::parse(&tiny, usd()), Err(too_precise.clone()));
        assert_eq!(too_precise.to_string(), "has more decimal places than USD allows (2)");
        for negative in ["-1", "-0.01", "-1e400", "-1E2", "-12.50"] {
            assert_eq!(Amount::parse(negative, usd()), Err(AmountError::Negative), "{negative:?}");
        }
        assert_eq!(Amount::parse("1000000000000000", usd()), Err(AmountError::TooLarge));
        assert_eq!(Amount::parse("999999999999999.01", usd()), Err(AmountError::TooLarge));
        assert_eq!(Amount::parse(&"9".repeat(40), usd()), Err(AmountError::TooLarge));
        let malformed = [
            "", "+1", "1_000", " 1", "1 ", "1,5", ".5", "5.", "NaN", "inf", "0x10", "1e", "--1", "1e2",
            "1E2", "1.25e1", "1e-400", "1e16", "-0", "-0.00", "-0e5", "-", "-abc", "1.2.3", "١",
        ];
        for bad in malformed {
            assert_eq!(Amount::parse(bad, usd()), Err(AmountError::Malformed), "{bad:?}");
        }
        assert!(AmountError::Malformed.to_string().starts_with("must be a decimal string such as \"12.50\""));
    }

    #[test]
    fn values_without_a_currency_follow_the_same_rules_to_the_finest_minor_unit() {
        assert_eq!(parse_value("48.48").unwrap(), Decimal::new(4848, 2));
        assert_eq!(parse_value("48.480").unwrap(), Decimal::new(4848, 2));
        assert_eq!(parse_value("1.234").unwrap(), Decimal::new(1234, 3));
        let too_precise = parse_value("1.2345").unwrap_err();
        assert_eq!(too_precise.to_string(), "has more decimal places than any supported currency allows (3)");
        assert_eq!(parse_value("-1"), Err(AmountError::Negative));
        assert_eq!(parse_value("1e2"), Err(AmountError::Malformed));
        assert_eq!(parse_value("-0"), Err(AmountError::Malformed));
        assert_eq!(parse_value("1000000000000000"), Err(AmountError::TooLarge));
        assert_eq!(parse_value("999999999999999.5"), Err(AmountError::TooLarge));
    }

    #[test]
    fn arithmetic_is_checked_not_wrapped() {
        let price = Amount::parse("999999999999999", usd()).unwrap();
        assert_eq!(price.checked_mul(2), Err(AmountError::TooLarge));
        assert_eq!(price.checked_add(&price), Err(AmountError::TooLarge));
        let price = Amount::parse("0.10", usd()).unwrap();
        assert_eq!(price.checked_mul(3).unwrap().to_string(), "0.30");
    }

    mod properties {
        use proptest::prelude::*;

        use super::super::*;

        /// openapi.yaml's money pattern, `^[0-9]+(\.[0-9]+)?$`, by hand.
        fn matches_published_pattern(text: &str) -> bool {
            let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
            match text.split_once('.') {
                Some((integer, fraction)) => digits(integer) && digits(fraction),
                None => digits(text),
            }
        }

        proptest! {
            #[test]
            fn parsing_never_panics(text in ".{0,40}") {
                let _ = Amount::parse(&text, Currency::parse("USD").unwrap());
            }

            #[test]
            fn amounts_round_trip_exactly(units in 0_u64..1_000_000_000_000_000, cents in 0_u32..100) {
                let text = format!("{units}.{cents:02}");
                let amount = Amount::parse(&text, Currency::parse("USD").unwrap()).unwrap();
                prop_assert_eq!(amount.to_string(), text);
            }

            #[test]
            fn finer_than_the_minor_unit_is_refused(units in 0_u64..1_000_000, mills in 1_u32..10) {
                let text = format!("{units}.00{mills}");
                let refused = matches!(
                    Amount::parse(&text, Currency::parse("USD").unwrap()),
                    Err(AmountError::TooPrecise { .. })
                );
                prop_assert!(refused);
            }

            /// Whatever the text, an accepted amount matches the published pattern
            /// `^[0-9]+(\.[0-9]+)?$`.
            #[test]
            fn only_the_published_grammar_is_accepted(text in "[-+0-9.eE_ ,]{0,12}") {
                let currency = Currency::parse("KWD").unwrap();
                if Amount::parse(&text, currency).is_ok() || parse_value(&text).is_ok() {
                    prop_assert!(matches_published_pattern(&text), "{text:?} was accepted");
                }
            }

            #[test]
            fn the_published_grammar_within_the_limits_is_accepted(
                integer in "[0-9]{1,15}",
                decimals in "(\\.[0-9]{1,3})?",
                zeros in 0_usize..30,
            ) {
                let exact = Decimal::from_str_exact(&format!("{integer}{decimals}")).unwrap();
                let padding = if decimals.is_empty() { String::new() } else { "0".repeat(zeros) };
                let text = format!("{integer}{decimals}{padding}");
                prop_assert_eq!(parse_value(&text), Ok(exact));
                let kwd = Currency::parse("KWD").unwrap();
                prop_assert_eq!(Amount::parse(&text, kwd).map(|amount| amount.value()), Ok(exact));
            }

            #[test]
            fn an_exponent_is_malformed_whatever_its_value(
                mantissa in "[0-9]{1,6}(\\.[0-9]{1,3})?",
                exponent in "[eE][-+]?[0-9]{1,3}",
            ) {
                let text = format!("{mantissa}{exponent}");
                prop_assert_eq!(Amount::parse(&text, Currency::parse("USD").unwrap()), Err(AmountError::Malformed));
                prop_assert_eq!(parse_value(&text), Err(AmountError::Malformed));
            }

            #[test]
            fn a_minus_sign_is_negative_below_zero_and_malformed_on_zero(
                mantissa in "[0-9]{1,6}(\\.[0-9]{1,3})?([eE][-+]?[0-9]{1,3})?",
            ) {
                let text = format!("-{mantissa}");
                let significant = mantissa.split(['e', 'E']).next().unwrap();
                let expected = if significant.bytes().any(|b| b != b'0' && b != b'.') {
                    AmountError::Negative
                } else {
                    AmountError::Malformed
                };
                prop_assert_eq!(Amount::parse(&text, Currency::parse("USD").unwrap()), Err(expected.clone()));
                prop_assert_eq!(parse_value(&text), Err(expected));
            }

            #[test]
            fn trailing_zeros_do_not_change_the_amount(
                units in 0_u64..1_000_000_000_000_000,
                cents in 0_u32..100,
                zeros in 0_usize..40,
            ) {
                let usd = Currency::parse("USD").unwrap();
                let plain = Amount::parse(&format!("{units}.{cents:02}"), usd).unwrap();
                let padded = Amount::parse(&format!("{units}.{cents:02}{}", "0".repeat(zeros)), usd).unwrap();
                prop_assert_eq!(plain, padded);
            }

            /// A non-zero digit past the minor unit is refused with the currency and its minor
            /// unit named, however far past it is; up to the minor unit, the value is exact.
            #[test]
            fn precision_is_checked_against_the_currency_named_in_the_error(
                index in 0_usize..CURRENCIES.len(),
                units in 0_u64..1_000_000,
                decimals in "[0-9]{0,6}",
                padding in 0_usize..30,
            ) {
                let (code, minor_units) = CURRENCIES[index];
                let currency = Currency::parse(code).unwrap();
                let text = if decimals.is_empty() {
                    units.to_string()
                } else {
                    format!("{units}.{decimals}{}", "0".repeat(padding))
                };
                let significant = decimals.trim_end_matches('0').len();
                match Amount::parse(&text, currency) {
                    Ok(amount) => {
                        prop_assert!(significant <= minor_units as usize, "{text} accepted in {code}");
                        let exact = format!("{units}.{}", if decimals.is_empty() { "0" } else { decimals.as_str() });
                        prop_assert_eq!(amount.value(), Decimal::from_str_exact(&exact).unwrap());
                    }
                    Err(error) => {
                        prop_assert!(significant > minor_units as usize, "{text} refused in {code}: {error}");
                        prop_assert_eq!(error.to_string(), format!("has more decimal places than {code} allows ({minor_units})"));
                    }
                }
            }

            #[test]
            fn products_and_sums_are_exact_or_refused(
                lines in prop::collection::vec((0_u64..2_000_000_000_000_000, 1_u32..=10_000), 1..8)
            ) {
                let usd = Currency::parse("USD").unwrap();
                let mut total = Amount::zero(usd);
                let mut exact_cents: u128 = 0;
                let max_cents = 999_999_999_999_999_u128 * 100;
                for (cents, quantity) in lines {
                    let price = Amount::parse(&format!("{}.{:02}", cents / 100, cents % 100), usd).unwrap();
                    exact_cents += u128::from(cents) * u128::from(quantity);
                    match price.checked_mul(quantity).and_then(|line| total.checked_add(&line)) {
                        Ok(sum) => {
                            prop_assert!(exact_cents <= max_cents);
                            prop_assert_eq!(sum.to_string(), format!("{}.{:02}", exact_cents / 100, exact_cents % 100));
                            total = sum;
                        }
                        // Refused only past the maximum, never wrapped.
                        Err(_) => {
                            prop_assert!(exact_cents > max_cents);
                            break;
                        }
                    }
                }
            }
        }
    }
}
