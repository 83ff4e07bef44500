//! The server settings that decide what orderpay's writes cost, checked when `serve` starts.
//!
//! A payment writes several times the WAL of a new order, and after each checkpoint the first
//! change to a page writes the whole page. The same payments on the machine's shared server with
//! PostgreSQL's default settings (checkpoints every 5 minutes or 1 GB of WAL, uncompressed
//! full-page images, a 4 MB WAL buffer) ran at 0.24 of a private cluster with the settings of
//! `bench/postgresql.conf`, new orders at 0.86 (docs/performance.md). Those settings trade no
//! durability, so a server still below them is told, by name, which to raise: the advice is
//! logged, never enforced, since a laptop's PostgreSQL is a fine place to try orderpay.

use diesel_async::{AsyncPgConnection, RunQueryDsl};

crate::prepared_statement! {
    /// Each write setting as (name, value in its unit, unit, value as shown) (`write_settings.sql`).
    pub struct WriteSettings("write_settings.sql") -> (Text, Text, Text, Text);
}

/// One setting below what orderpay's writes want.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Advice {
    pub name: String,
    pub current: String,
    pub recommended: &'static str,
}

/// Each setting with the least value that does not hold writes back, and the value
/// `bench/postgresql.conf` recommends. Sizes in bytes, durations in seconds.
const FLOORS: [(&str, Floor, &str); 5] = [
    ("checkpoint_timeout", Floor::Amount(15 * 60), "30min"),
    ("max_wal_size", Floor::Amount(4 << 30), "16GB"),
    ("shared_buffers", Floor::Amount(1 << 30), "2GB, or about a quarter of the server's memory"),
    ("wal_buffers", Floor::Amount(16 << 20), "64MB"),
    ("wal_compression", Floor::NotOff, "lz4 (pglz where the server lacks lz4; on before PostgreSQL 15)"),
];

#[derive(Debug, Clone, Copy)]
enum Floor {
    /// At least this many bytes or seconds.
    Amount(u64),
    /// Anything but `off`.
    NotOff,
}

/// The advice for settings read as (name, value, unit, value as shown): those below their floor.
/// A value or unit this cannot read is left alone rather than guessed at.
pub fn advise(settings: &[(String, String, String, String)]) -> Vec<Advice> {
    settings
        .iter()
        .filter_map(|(name, value, unit, shown)| {
            let (_, floor, recommended) = FLOORS.iter().find(|(known, ..)| known == name)?;
            let below = match floor {
                Floor::NotOff => value == "off",
                Floor::Amount(least) => amount(value, unit)? < *least,
            };
            below.then(|| Advice { name: name.clone(), current: shown.clone(), recommended })
        })
        .collect()
}

/// A `pg_settings` value in bytes or seconds: `setting` times its `unit` (`8kB`, `MB`, `s`, ...).
fn amount(value: &str, unit: &str) -> Option<u64> {
    let count: u64 = value.parse().ok()?;
    let digits = unit.bytes().take_while(u8::is_ascii_digit).count();
    let (times, unit) = unit.split_at(digits);
    let times: u64 = if times.is_empty() { 1 } else { times.parse().ok()? };
    let scale: u64 = match unit {
        "B" | "s" => 1,
        "kB" => 1 << 10,
        "MB" => 1 << 20,
        "GB" => 1 << 30,
        "ms" => return Some(count * times / 1000),
        _ => return None,
    };
    Some(count * times * scale)
}

/// The server's write settings as (name, value in its unit, unit, value as shown), by name.
pub async fn read(
    conn: &mut AsyncPgConnection,
) -> diesel::QueryResult<Vec<(String, String, String, String)>> {
    WriteSettings.load(conn).await
}

/// Reads the server's write settings and logs, once, those still below what writes want.
/// A failed read is logged and otherwise ignored: the advice must never stop `serve`.
pub async fn advise_on(conn: &mut AsyncPgConnection) {
    let settings = match read(conn).await {
        Ok(settings) => settings,
        Err(error) => {
            tracing::debug!(%error, "cannot read the server's write settings");
            return;
        }
    };
    let advice = advise(&settings);
    if advice.is_empty() {
        return;
    }
    let listed: Vec<String> = advice
        .iter()
        .map(|advice| format!("{} = {} (recommended: {})", advice.name, advice.current, advice.recommended))
        .collect();
    tracing::warn!(
        settings = %listed.join("; "),
        "PostgreSQL runs with settings that make payments and refunds several times slower than they \
         need be (more WAL after every checkpoint); none of them trades durability. See \
         bench/postgresql.conf and docs/operations.md#postgresql-settings"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(name: &str, value: &str, unit: &str, shown: &str) -> (String, String, String, String) {
        (name.to_owned(), value.to_owned(), unit.to_owned(), shown.to_owned())
    }

    #[test]
    fn the_stock_settings_are_each_named_with_the_recommended_value() {
        let stock = [
            row("checkpoint_timeout", "300", "s", "5min"),
            row("max_wal_size", "1024", "MB", "1GB"),
            row("shared_buffers", "16384", "8kB", "128MB"),
            row("wal_buffers", "512", "8kB", "4MB"),
            row("wal_compression", "off", "", "off"),
        ];
        let advice = advise(&stock);
        let named: Vec<(&str, &str)> =
            advice.iter().map(|advice| (advice.name.as_str(), advice.current.as_str())).collect();
        assert_eq!(
            named,
            [
                ("checkpoint_timeout", "5min"),
                ("max_wal_size", "1GB"),
                ("shared_buffers", "128MB"),
                ("wal_buffers", "4MB"),
                ("wal_compression", "off"),
            ]
        );
        assert_eq!(advice[1].recommended, "16GB");
    }

    #[test]
    fn the_recommended_settings_get_no_advice() {
        let tuned = [
            row("checkpoint_timeout", "1800", "s", "30min"),
            row("max_wal_size", "16384", "MB", "16GB"),
            row("shared_buffers", "262144", "8kB", "2GB"),
            row("wal_buffers", "8192", "8kB", "64MB"),
            row("wal_compression", "lz4", "", "lz4"),
        ];
        assert_eq!(advise(&tuned), []);
    }

    #[test]
    fn a_value_or_unit_it_cannot_read_is_left_alone() {
        let odd = [row("max_wal_size", "many", "MB", "many"), row("wal_buffers", "512", "pages", "4MB")];
        assert_eq!(advise(&odd), []);
        assert_eq!(amount("2", "8kB"), Some(16 << 10));
        assert_eq!(amount("1500", "ms"), Some(1));
    }
}
