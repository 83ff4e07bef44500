//! Hand-written SQL that diesel can still prepare once per connection.
//!
//! The hot paths (a new order, a payment's two phases) are single statements with CTEs, kept
//! in `.sql` files so that the benchmark can run the very same text under pgbench. diesel's
//! `sql_query` would prepare such text anew on every call (one more round trip each time); a
//! type implementing `QueryFragment` with a static `QueryId` is prepared once and reused. This
//! module turns `$n` placeholders into diesel binds for such types.

use diesel::pg::Pg;
use diesel::query_builder::AstPass;
use diesel::result::{Error, QueryResult};

/// The statement text without its `--` comment lines (comments may not contain `$`).
pub fn strip_comments(sql: &str) -> String {
    sql.lines().filter(|line| !line.trim_start().starts_with("--")).collect::<Vec<_>>().join("\n")
}

/// Pushes `sql` into `out`, replacing each `$n` with `bind(n)`. A parameter used twice is bound
/// twice, so the prepared statement has one parameter per occurrence.
pub fn walk_numbered<'b>(
    out: &mut AstPass<'_, 'b, Pg>,
    name: &str,
    sql: &str,
    mut bind: impl FnMut(usize, &mut AstPass<'_, 'b, Pg>) -> QueryResult<()>,
) -> QueryResult<()> {
    let mut rest = sql;
    while let Some(at) = rest.find('$') {
        out.push_sql(&rest[..at]);
        let digits = rest[at + 1..].bytes().take_while(u8::is_ascii_digit).count();
        let number: usize = rest[at + 1..at + 1 + digits]
            .parse()
            .map_err(|_| Error::QueryBuilderError(format!("{name}: a `$` without a number").into()))?;
        bind(number, out)?;
        rest = &rest[at + 1 + digits..];
    }
    out.push_sql(rest);
    Ok(())
}

/// The error for a `$n` a statement does not define.
pub fn unknown_parameter(name: &str, number: usize) -> Error {
    Error::QueryBuilderError(format!("{name}: no parameter ${number}").into())
}
