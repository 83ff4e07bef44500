//! Rebuilds the crate when a migration is added or changed: `embed_migrations!` (src/db)
//! reads `migrations/` at compile time, and cargo watches only the sources it knows of.
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
