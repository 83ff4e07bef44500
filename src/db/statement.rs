//! Hand-written SQL that diesel prepares once per connection.
//!
//! The hot paths (a new order, a payment's phases) are single statements with CTEs, kept in
//! `.sql` files so that the benchmark can run the very same text under pgbench. diesel's
//! `sql_query` would prepare such text anew on every call (one more round trip each time); a
//! type implementing `QueryFragment` with a static `QueryId` is prepared once and reused.
//!
//! [`prepared_statement!`] declares such a type: its fields are the statement's parameters, each
//! with its `$n` and its SQL type. The `$n` of the file and the declared numbers are compared at
//! compile time ([`parameters_match`]): a parameter used but not declared, or declared but not
//! used, does not compile. The text is split into literal pieces and parameters once per process,
//! not on every execution. Comment lines (`--` first on the line) are dropped and may not hold
//! a `$`.

use std::sync::OnceLock;

/// One piece of a statement: literal SQL, or the parameter with this number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Segment {
    Sql(String),
    Parameter(usize),
}

/// A statement's text split at its parameters, comment lines dropped.
#[derive(Debug)]
pub struct ParsedSql(Vec<Segment>);

impl ParsedSql {
    pub fn parse(sql: &str) -> ParsedSql {
        let text: Vec<&str> = sql.lines().filter(|line| !line.trim_start().starts_with("--")).collect();
        let text = text.join("\n");
        let mut segments = Vec::new();
        let mut rest = text.as_str();
        while let Some(at) = rest.find('$') {
            let digits = rest[at + 1..].bytes().take_while(u8::is_ascii_digit).count();
            // `parameters_match` has already refused a `$` without a number at compile time.
            let number = rest[at + 1..at + 1 + digits].parse().unwrap_or(0);
            segments.push(Segment::Sql(rest[..at].to_owned()));
            segments.push(Segment::Parameter(number));
            rest = &rest[at + 1 + digits..];
        }
        segments.push(Segment::Sql(rest.to_owned()));
        ParsedSql(segments)
    }

    pub fn segments(&self) -> &[Segment] {
        &self.0
    }
}

/// The parsed form of a statement's text, computed on first use.
pub fn parsed(cell: &'static OnceLock<ParsedSql>, sql: &'static str) -> &'static ParsedSql {
    cell.get_or_init(|| ParsedSql::parse(sql))
}

/// Whether the `$n` placeholders of `sql` (outside comment lines) are exactly `declared`: every
/// one used is declared and every declared one is used. `const`, so that the check runs when
/// the crate compiles.
pub const fn parameters_match(sql: &str, declared: &[usize]) -> bool {
    let bytes = sql.as_bytes();
    let mut used: u128 = 0;
    let mut at = 0;
    let mut line_start = true;
    while at < bytes.len() {
        if line_start {
            let mut first = at;
            while first < bytes.len() && (bytes[first] == b' ' || bytes[first] == b'\t') {
                first += 1;
            }
            if first + 1 < bytes.len() && bytes[first] == b'-' && bytes[first + 1] == b'-' {
                while at < bytes.len() && bytes[at] != b'\n' {
                    at += 1;
                }
                continue;
            }
            line_start = false;
        }
        match bytes[at] {
            b'\n' => line_start = true,
            b'$' => {
                let mut number = 0_usize;
                let mut digits = 0;
                while at + 1 < bytes.len() && bytes[at + 1].is_ascii_digit() {
                    number = number * 10 + (bytes[at + 1] - b'0') as usize;
                    digits += 1;
                    at += 1;
                }
                if digits == 0 || number == 0 || number > 127 || !contains(declared, number) {
                    return false;
                }
                used |= 1 << number;
            }
            _ => {}
        }
        at += 1;
    }
    let mut index = 0;
    while index < declared.len() {
        if declared[index] > 127 || used & (1 << declared[index]) == 0 {
            return false;
        }
        index += 1;
    }
    true
}

const fn contains(list: &[usize], value: usize) -> bool {
    let mut index = 0;
    while index < list.len() {
        if list[index] == value {
            return true;
        }
        index += 1;
    }
    false
}

/// The length of `text` with every `from` replaced by `to` (for [`replace`], at compile time).
pub const fn replaced_length(text: &str, from: &str, to: &str) -> usize {
    let (text, from) = (text.as_bytes(), from.as_bytes());
    let (mut at, mut length) = (0, 0);
    while at < text.len() {
        if starts_with_at(text, at, from) {
            length += to.len();
            at += from.len();
        } else {
            length += 1;
            at += 1;
        }
    }
    length
}

/// `text` with every `from` replaced by `to`, as bytes (`N` is [`replaced_length`]), at compile
/// time: one template statement for several tables of the same shape.
pub const fn replace<const N: usize>(text: &str, from: &str, to: &str) -> [u8; N] {
    let (text, from, to) = (text.as_bytes(), from.as_bytes(), to.as_bytes());
    let mut out = [0_u8; N];
    let (mut at, mut written) = (0, 0);
    while at < text.len() {
        if starts_with_at(text, at, from) {
            let mut index = 0;
            while index < to.len() {
                out[written] = to[index];
                written += 1;
                index += 1;
            }
            at += from.len();
        } else {
            out[written] = text[at];
            written += 1;
            at += 1;
        }
    }
    out
}

const fn starts_with_at(text: &[u8], at: usize, prefix: &[u8]) -> bool {
    if prefix.is_empty() || at + prefix.len() > text.len() {
        return false;
    }
    let mut index = 0;
    while index < prefix.len() {
        if text[at + index] != prefix[index] {
            return false;
        }
        index += 1;
    }
    true
}

/// What a statement declares (its files, its text, its parameters), for the checks of the tests
/// (the unit tests' and the integration tests' plans).
#[cfg(any(test, feature = "test-hooks"))]
pub type Declared = (
    &'static [&'static str],
    &'static str,
    &'static [&'static [usize]],
    &'static [&'static [(usize, &'static str)]],
);

#[cfg(any(test, feature = "test-hooks"))]
pub fn declared<S: Statement>() -> Declared {
    (S::FILES, S::SQL, S::PARAMETERS, S::TYPES)
}

/// A prepared statement as declared by [`prepared_statement!`], for the checks below.
pub trait Statement {
    /// The `.sql` files the text is made of, relative to the declaring module.
    const FILES: &'static [&'static str];
    const SQL: &'static str;
    /// The declared parameter numbers, including those of a parameter group.
    const PARAMETERS: &'static [&'static [usize]];
    /// Each parameter's number and diesel SQL type as written (`Nullable<Text>`), for the tests
    /// that prepare the text outside diesel.
    const TYPES: &'static [&'static [(usize, &'static str)]];
}

/// Parameters shared by several statements, because they share a leading piece of SQL (the
/// key claim of `idempotency/claim_key.sql`): bound by number, like the statement's own.
pub trait ParameterGroup {
    const PARAMETERS: &'static [usize];
    /// Each parameter's number and diesel SQL type, as [`Statement::TYPES`].
    const TYPES: &'static [(usize, &'static str)];
    /// Binds parameter `number` if it is one of this group's; returns whether it was.
    fn bind<'b>(
        &'b self,
        number: usize,
        out: &mut diesel::query_builder::AstPass<'_, 'b, diesel::pg::Pg>,
    ) -> diesel::QueryResult<bool>;
}

/// Implements [`ParameterGroup`] for a struct with one lifetime from one list of its parameters,
/// as `prepared_statement!` declares a statement's own, so each parameter's number, field and SQL
/// type are written once:
///
/// ```ignore
/// parameter_group! {
///     ClaimParameters {
///         1 => account_id as Uuid,
///         2 => key as Nullable<Text>,
///     }
/// }
/// ```
#[macro_export]
macro_rules! parameter_group {
    ($group:ident { $( $number:literal => $field:ident as $sql_type:ty ),* $(,)? }) => {
        impl $crate::db::statement::ParameterGroup for $group<'_> {
            const PARAMETERS: &'static [usize] = &[$($number),*];
            const TYPES: &'static [(usize, &'static str)] = &[$(($number, stringify!($sql_type))),*];

            fn bind<'b>(
                &'b self,
                number: usize,
                out: &mut diesel::query_builder::AstPass<'_, 'b, diesel::pg::Pg>,
            ) -> diesel::QueryResult<bool> {
                #[allow(unused_imports)]
                use diesel::sql_types::*;
                match number {
                    $( $number => out.push_bind_param::<$sql_type, _>(&self.$field)?, )*
                    _ => return Ok(false),
                }
                Ok(true)
            }
        }
    };
}

/// [`parameters_match`] for parameters declared in several lists.
pub const fn all_parameters_match(sql: &str, declared: &[&[usize]]) -> bool {
    let mut flat = [0_usize; 128];
    let mut count = 0;
    let mut list = 0;
    while list < declared.len() {
        let mut index = 0;
        while index < declared[list].len() {
            if count == flat.len() {
                return false;
            }
            flat[count] = declared[list][index];
            count += 1;
            index += 1;
        }
        list += 1;
    }
    let (used, _) = flat.split_at(count);
    parameters_match(sql, used)
}

/// Declares a hand-written statement read from `.sql` files beside the calling module (their
/// texts are concatenated, so a shared leading piece can be reused):
///
/// ```ignore
/// prepared_statement! {
///     /// Phase 1 of a payment.
///     pub struct StartPayment<'a>("../idempotency/claim_key.sql", "start_payment.sql")
///         -> (Text, Nullable<Text>)
///     {
///         group claim: ClaimParameters<'a>,
///         13 => order_id: OrderId as Uuid,
///     }
/// }
/// ```
///
/// The struct gets one public field per parameter, and one for the parameter group if any.
/// The statement is prepared once per connection (static `QueryId`) and returns rows of the
/// given SQL type.
#[macro_export]
macro_rules! prepared_statement {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident<$lt:lifetime>($($file:literal),+) -> $returns:ty {
            $( group $group:ident : $group_type:ty, )?
            $( $number:literal => $field:ident : $field_type:ty as $sql_type:ty ),* $(,)?
        }
    ) => {
        $crate::prepared_statement! {
            @declare [$(#[$meta])*] $vis $name $lt [$($file),+] [concat!($(include_str!($file)),+)] $returns {
                $( group $group : $group_type, )?
                $( $number => $field : $field_type as $sql_type ),*
            }
        }
    };
    // A statement without parameters: a unit struct.
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident($($file:literal),+) -> $returns:ty;
    ) => {
        $(#[$meta])*
        $vis struct $name;

        impl $crate::db::statement::Statement for $name {
            const FILES: &'static [&'static str] = &[$($file),+];
            const SQL: &'static str = concat!($(include_str!($file)),+);
            const PARAMETERS: &'static [&'static [usize]] = &[&[]];
            const TYPES: &'static [&'static [(usize, &'static str)]] = &[&[]];
        }

        const _: () = assert!(
            $crate::db::statement::parameters_match(<$name as $crate::db::statement::Statement>::SQL, &[]),
            concat!(stringify!($name), ": its SQL uses parameters"),
        );

        impl diesel::query_builder::QueryId for $name {
            type QueryId = $name;
            const HAS_STATIC_QUERY_ID: bool = true;
        }

        const _: () = {
            #[allow(unused_imports)]
            use diesel::sql_types::*;
            impl diesel::query_builder::Query for $name {
                type SqlType = $returns;
            }
        };

        impl diesel::query_builder::QueryFragment<diesel::pg::Pg> for $name {
            fn walk_ast<'b>(
                &'b self,
                mut out: diesel::query_builder::AstPass<'_, 'b, diesel::pg::Pg>,
            ) -> diesel::QueryResult<()> {
                static PARSED: std::sync::OnceLock<$crate::db::statement::ParsedSql> =
                    std::sync::OnceLock::new();
                let sql = $crate::db::statement::parsed(&PARSED, <Self as $crate::db::statement::Statement>::SQL);
                for segment in sql.segments() {
                    if let $crate::db::statement::Segment::Sql(text) = segment {
                        out.push_sql(text);
                    }
                }
                Ok(())
            }
        }
    };
    // One template for several tables of the same shape (the operation tables): every
    // `$placeholder` of the file is replaced by `$value` when the crate compiles.
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident<$lt:lifetime>(template $file:literal, $placeholder:literal => $value:literal)
            -> $returns:ty
        {
            $( group $group:ident : $group_type:ty, )?
            $( $number:literal => $field:ident : $field_type:ty as $sql_type:ty ),* $(,)?
        }
    ) => {
        $crate::prepared_statement! {
            @declare [$(#[$meta])*] $vis $name $lt [$file]
            [{
                const TEMPLATE: &str = include_str!($file);
                const LENGTH: usize = $crate::db::statement::replaced_length(TEMPLATE, $placeholder, $value);
                const BYTES: [u8; LENGTH] = $crate::db::statement::replace::<LENGTH>(TEMPLATE, $placeholder, $value);
                match core::str::from_utf8(&BYTES) {
                    Ok(sql) => sql,
                    Err(_) => panic!("a template's replacement is not UTF-8"),
                }
            }]
            $returns {
                $( group $group : $group_type, )?
                $( $number => $field : $field_type as $sql_type ),*
            }
        }
    };
    (
        @declare [$(#[$meta:meta])*] $vis:vis $name:ident $lt:lifetime [$($file:literal),+] [$sql:expr] $returns:ty {
            $( group $group:ident : $group_type:ty, )?
            $( $number:literal => $field:ident : $field_type:ty as $sql_type:ty ),*
        }
    ) => {
        $(#[$meta])*
        $vis struct $name<$lt> {
            $( pub $group: $group_type, )?
            $( pub $field: $field_type, )*
        }

        impl<$lt> $crate::db::statement::Statement for $name<$lt> {
            const FILES: &'static [&'static str] = &[$($file),+];
            const SQL: &'static str = $sql;
            const PARAMETERS: &'static [&'static [usize]] = &[
                $( <$group_type as $crate::db::statement::ParameterGroup>::PARAMETERS, )?
                &[$($number),*],
            ];
            const TYPES: &'static [&'static [(usize, &'static str)]] = &[
                $( <$group_type as $crate::db::statement::ParameterGroup>::TYPES, )?
                &[$(($number, stringify!($sql_type))),*],
            ];
        }

        const _: () = assert!(
            $crate::db::statement::all_parameters_match(
                <$name<'static> as $crate::db::statement::Statement>::SQL,
                <$name<'static> as $crate::db::statement::Statement>::PARAMETERS,
            ),
            concat!(stringify!($name), ": the $n of its SQL and the declared parameters differ"),
        );

        impl diesel::query_builder::QueryId for $name<'_> {
            type QueryId = $name<'static>;
            const HAS_STATIC_QUERY_ID: bool = true;
        }

        const _: () = {
            #[allow(unused_imports)]
            use diesel::sql_types::*;
            impl diesel::query_builder::Query for $name<'_> {
                type SqlType = $returns;
            }
        };

        impl diesel::query_builder::QueryFragment<diesel::pg::Pg> for $name<'_> {
            fn walk_ast<'b>(
                &'b self,
                mut out: diesel::query_builder::AstPass<'_, 'b, diesel::pg::Pg>,
            ) -> diesel::QueryResult<()> {
                #[allow(unused_imports)]
                use diesel::sql_types::*;
                static PARSED: std::sync::OnceLock<$crate::db::statement::ParsedSql> =
                    std::sync::OnceLock::new();
                let sql = $crate::db::statement::parsed(
                    &PARSED,
                    <Self as $crate::db::statement::Statement>::SQL,
                );
                for segment in sql.segments() {
                    match segment {
                        $crate::db::statement::Segment::Sql(text) => out.push_sql(text),
                        $crate::db::statement::Segment::Parameter(number) => match *number {
                            $( $number => out.push_bind_param::<$sql_type, _>(&self.$field)?, )*
                            other => {
                                $(
                                    if $crate::db::statement::ParameterGroup::bind(
                                        &self.$group, other, &mut out,
                                    )? {
                                        continue;
                                    }
                                )?
                                // Refused at compile time by `all_parameters_match`.
                                return Err(diesel::result::Error::QueryBuilderError(
                                    format!("{}: no parameter ${other}", stringify!($name)).into(),
                                ));
                            }
                        },
                    }
                }
                Ok(())
            }
        }
    };
}

/// Every hand-written statement of the crate: each kind's own, then the rest. A `.sql` file
/// that none of them reads fails
/// `every_sql_file_is_read_by_a_statement_that_declares_its_parameters`, so a new statement
/// cannot be left out of this list; the integration tests plan each of them on a fresh schema
/// (`database::no_statement_is_planned_to_walk_a_whole_account`).
#[cfg(any(test, feature = "test-hooks"))]
pub fn every_statement() -> Vec<Declared> {
    /// Each kind's own statements ([`crate::operations::Kind::statements`]).
    macro_rules! kind_statements {
        ($( $kind:path => $variant:ident($table:literal, $label:literal, $resource:ident = $spelling:literal) ),* $(,)?) => {
            [$( <$kind as crate::operations::Kind>::statements() ),*].concat()
        };
    }
    let mut statements = crate::operations::every_kind!(kind_statements);
    statements.extend(crate::operations::leases::declared_statements());
    statements.extend(crate::settlement::repository::declared_statements());
    statements.extend([
        declared::<crate::idempotency::store::ClaimKey<'static>>(),
        declared::<crate::orders::repository::NewOrderStatement<'static>>(),
        declared::<crate::payments::watches::EndAuthorization<'static>>(),
        declared::<crate::refunds::repository::WatchLateRefunds<'static>>(),
        declared::<crate::payments::watches::WatchAuthorizations<'static>>(),
        declared::<crate::payments::watches::WatchLateCharges<'static>>(),
        declared::<crate::idempotency::store::ExpireKey<'static>>(),
        declared::<crate::idempotency::store::SweepKeys<'static>>(),
        declared::<crate::idempotency::store::PurgeAudit<'static>>(),
        declared::<crate::operations::webhooks::SweepProviderWebhooks<'static>>(),
        declared::<crate::events::repository::TakeRelay<'static>>(),
        declared::<crate::events::repository::ReadCursor<'static>>(),
        declared::<crate::events::repository::RestartCursor<'static>>(),
        declared::<crate::events::repository::ReadAfter<'static>>(),
        declared::<crate::events::repository::AdvanceCursor<'static>>(),
        declared::<crate::events::repository::Lag<'static>>(),
        declared::<crate::events::repository::Sweep<'static>>(),
        declared::<crate::merchant_webhooks::endpoints::DeleteEndpoint<'static>>(),
        declared::<crate::merchant_webhooks::endpoints::Subscribers<'static>>(),
        declared::<crate::merchant_webhooks::queue::ClaimDue<'static>>(),
        declared::<crate::merchant_webhooks::queue::RecordFinished<'static>>(),
        declared::<crate::merchant_webhooks::queue::FailingEndpoints>(),
        declared::<crate::merchant_webhooks::retention::PurgeDeliveries<'static>>(),
        declared::<crate::accounts::keys::LookupKey<'static>>(),
        declared::<crate::accounts::ListAccounts>(),
        declared::<crate::ledger::CheckMovements>(),
        declared::<crate::db::IsWritable>(),
        declared::<crate::db::write_settings::WriteSettings>(),
        declared::<crate::ledger::CheckPayments>(),
        declared::<crate::ledger::CheckOrders<'static>>(),
        declared::<crate::disputes::repository::RecordDispute<'static>>(),
    ]);
    statements
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_checked_against_the_declaration() {
        assert!(parameters_match("SELECT $1, $2, $1", &[1, 2]));
        assert!(!parameters_match("SELECT $1", &[1, 2]), "declared but unused");
        assert!(!parameters_match("SELECT $1, $3", &[1]), "used but undeclared");
        assert!(!parameters_match("SELECT $", &[1]), "a $ without a number");
        assert!(parameters_match("-- $9 in a comment\nSELECT $1\n  -- $8\n", &[1]));
    }

    #[test]
    fn statements_split_at_their_parameters_without_comment_lines() {
        let parsed = ParsedSql::parse("-- note\nSELECT $1,\n  $12 -- trailing\n");
        assert_eq!(
            parsed.segments(),
            [
                Segment::Sql("SELECT ".into()),
                Segment::Parameter(1),
                Segment::Sql(",\n  ".into()),
                Segment::Parameter(12),
                Segment::Sql(" -- trailing".into()),
            ]
        );
    }

    #[test]
    fn every_sql_file_is_read_by_a_statement_that_declares_its_parameters() {
        let statements = every_statement();
        for (files, sql, parameters, _) in &statements {
            assert!(all_parameters_match(sql, parameters), "{files:?}: $n and declared parameters differ");
        }
        let read: Vec<&str> = statements
            .iter()
            .flat_map(|(files, _, _, _)| files.iter())
            .filter_map(|file| file.rsplit('/').next())
            .collect();
        let mut folders = vec![std::path::PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/src"))];
        let mut found = 0;
        while let Some(folder) = folders.pop() {
            for entry in std::fs::read_dir(&folder).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    folders.push(path);
                } else if path.extension().is_some_and(|extension| extension == "sql") {
                    let name = path.file_name().unwrap().to_str().unwrap();
                    assert!(read.contains(&name), "{} is read by no statement", path.display());
                    found += 1;
                }
            }
        }
        let distinct: std::collections::HashSet<&str> = read.iter().copied().collect();
        assert!(found >= distinct.len(), "found {found} .sql files for {} read", distinct.len());
    }
}
