//! Money: ISO 4217 currencies and exact decimal amounts.
//!
//! Amounts are [`rust_decimal::Decimal`] from the request text to the database and back; nothing
//! here ever touches a float. An [`Amount`] is only built by parsing (or by checked arithmetic on
//! amounts), so it is always non-negative, within [`Amount::MAX`] and never finer than its
//! currency's minor unit.

use std::fmt;
use std::str::FromStr;

use rust_decimal::Decimal;

/// An ISO 4217 alphabetic currency code that orderpay accepts, with its minor unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
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

/// A non-negative amount of money in a known currency, exact to the currency's minor unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Amount {
    value: Decimal,
    currency: Currency,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AmountError {
    #[error("must be a decimal number such as \"12.50\"")]
    Malformed,
    #[error("must not be negative")]
    Negative,
    #[error("has more decimal places than {currency} allows ({minor_units})")]
    TooPrecise { currency: &'static str, minor_units: u32 },
    #[error("exceeds the maximum amount of {}", Amount::MAX)]
    TooLarge,
}

impl Amount {
    /// The largest amount orderpay handles, in major units: far above any real order, far below
    /// what NUMERIC(19,4) or the decimal type could overflow on.
    pub const MAX: Decimal = Decimal::from_parts(2_764_472_319, 232_830, 0, false, 0); // 999_999_999_999_999

    pub fn zero(currency: Currency) -> Self {
        Amount { value: Decimal::ZERO, currency }
    }

    /// Parses the exact decimal text of an amount: `"12.50"`, `"0"`, or JSON number text like
    /// `12.5` or `1.25e1`. Signs other than a leading minus, spaces, separators and special
    /// values are refused; the value must be within the currency's minor unit.
    pub fn parse(text: &str, currency: Currency) -> Result<Self, AmountError> {
        let value = parse_decimal(text)?;
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

/// Strict decimal grammar: `-?digits(.digits)?` with an optional JSON exponent. rust_decimal's
/// own parser is more lenient (underscores, a leading `+`), which an API must not be.
pub fn parse_decimal(text: &str) -> Result<Decimal, AmountError> {
    let (mantissa, exponent) = match text.find(['e', 'E']) {
        Some(at) => (&text[..at], Some(&text[at + 1..])),
        None => (text, None),
    };
    let digits = mantissa.strip_prefix('-').unwrap_or(mantissa);
    let (integer, fraction) = match digits.split_once('.') {
        Some((integer, fraction)) => (integer, Some(fraction)),
        None => (digits, None),
    };
    let all_digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !all_digits(integer) || fraction.is_some_and(|f| !all_digits(f)) {
        return Err(AmountError::Malformed);
    }
    // Anything with more than 28 significant digits cannot be a money amount we accept; refusing
    // it early keeps the decimal parser from rounding.
    if integer.len() + fraction.map_or(0, str::len) > 28 {
        return Err(AmountError::TooLarge);
    }
    match exponent {
        None => Decimal::from_str_exact(mantissa).map_err(|_| AmountError::Malformed),
        Some(exponent) => {
            let exponent_digits = exponent.strip_prefix(['-', '+']).unwrap_or(exponent);
            if !all_digits(exponent_digits) || exponent_digits.len() > 3 {
                return Err(AmountError::Malformed);
            }
            let exponent: i32 = exponent.parse().map_err(|_| AmountError::Malformed)?;
            if exponent > 15 {
                return Err(AmountError::TooLarge);
            }
            if exponent < -28 {
                return Err(AmountError::TooPrecise { currency: "any", minor_units: 0 });
            }
            Decimal::from_scientific(&format!("{mantissa}e{exponent}")).map_err(|_| AmountError::Malformed)
        }
    }
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
            ("1.25e1", "12.50"),
            ("100.000", "100.00"),
            ("-0", "0.00"),
            ("999999999999999", "999999999999999.00"),
        ];
        for (input, printed) in cases {
            assert_eq!(Amount::parse(input, usd()).unwrap().to_string(), printed, "{input}");
        }
        let jpy = Currency::parse("JPY").unwrap();
        assert_eq!(Amount::parse("1200", jpy).unwrap().to_string(), "1200");
        assert_eq!(Amount::parse("1200.0", jpy).unwrap().to_string(), "1200");
    }

    #[test]
    fn bad_amounts_are_refused_with_a_reason() {
        let jpy = Currency::parse("JPY").unwrap();
        assert_eq!(
            Amount::parse("1.5", jpy).unwrap_err(),
            AmountError::TooPrecise { currency: "JPY", minor_units: 0 }
        );
        assert!(matches!(Amount::parse("0.001", usd()), Err(AmountError::TooPrecise { .. })));
        assert_eq!(Amount::parse("-1", usd()), Err(AmountError::Negative));
        assert_eq!(Amount::parse("1e16", usd()), Err(AmountError::TooLarge));
        assert_eq!(Amount::parse("1000000000000000", usd()), Err(AmountError::TooLarge));
        assert_eq!(Amount::parse(&"9".repeat(40), usd()), Err(AmountError::TooLarge));
        for bad in ["", "+1", "1_000", " 1", "1 ", "1,5", ".5", "5.", "NaN", "inf", "0x10", "1e", "--1"] {
            assert_eq!(Amount::parse(bad, usd()), Err(AmountError::Malformed), "{bad:?}");
        }
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
