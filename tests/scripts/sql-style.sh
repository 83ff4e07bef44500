#!/usr/bin/env bash
# One SQL style per purpose (docs/architecture.md): hand-written statements live in .sql files
# declared with `prepared_statement!`, never in Rust strings (src/db/mod.rs, the database layer
# itself, is the exception: it creates databases and takes the migration lock), and the statuses of our
# rows are spelled only in `text_enum!` declarations and .sql files. Part of `make lint`.
set -euo pipefail
cd "$(dirname "$0")/../.."

# The values of every `...Status` enum declared with text_enum!.
statuses=$(grep -rhozP 'enum \w*Status \{[^}]*\}' src --include=*.rs | tr '\0' '\n' \
  | grep -oP '= "\K[a-z_]+(?=")' | sort -u | paste -sd'|')
[ -n "$statuses" ] || { echo "sql-style: found no status enums under src/" >&2; exit 1; }

code_lines() { grep -rnE --include=*.rs "$1" src | grep -v '^src/db/mod.rs:' | grep -vE '^[^:]+:[0-9]+:\s*//' || true; }

raw=$(code_lines 'sql_query\(')
built=$(code_lines 'format!\("\s*(SELECT|UPDATE|INSERT|DELETE|WITH)\b')
quoted=$(code_lines "'($statuses)'")
failed=0
report() {
  if [ -n "$2" ]; then
    echo "sql-style: $1:" >&2
    echo "$2" >&2
    failed=1
  fi
}
report "raw SQL in Rust (move it to a .sql file declared with prepared_statement!)" "$raw"
report "SQL built with format! (a prepared statement per table, or a template)" "$built"
report "a status spelled in SQL inside Rust (it belongs in a .sql file)" "$quoted"
[ "$failed" = 0 ] && echo "sql-style: statements in .sql files, statuses only in text_enum! and .sql"
exit "$failed"
