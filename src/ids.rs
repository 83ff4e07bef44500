//! Typed ids: one newtype per kind of resource, so that a payment id cannot be passed where an
//! order id or a lease id is expected.
//!
//! Every id is a UUIDv7 (time-ordered, so B-tree friendly and sortable by creation), stored as
//! `uuid` and shown as its hyphenated text.

use std::fmt;

use uuid::Uuid;

macro_rules! id_type {
    ($(#[$meta:meta])* $name:ident) => {
        $(#[$meta])*
        #[derive(
            Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord,
            diesel::expression::AsExpression, diesel::deserialize::FromSqlRow, serde::Serialize,
        )]
        #[diesel(sql_type = diesel::sql_types::Uuid)]
        #[serde(transparent)]
        pub struct $name(Uuid);

        impl $name {
            /// A new, time-ordered id.
            pub fn generate() -> Self {
                $name(Uuid::now_v7())
            }

            pub const fn from_uuid(uuid: Uuid) -> Self {
                $name(uuid)
            }

            pub const fn as_uuid(&self) -> Uuid {
                self.0
            }

            /// Parses the hyphenated (or simple) text of a UUID.
            pub fn parse(text: &str) -> Option<Self> {
                Uuid::try_parse(text).ok().map($name)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.0, f)
            }
        }

        impl diesel::serialize::ToSql<diesel::sql_types::Uuid, diesel::pg::Pg> for $name {
            fn to_sql<'b>(
                &'b self,
                out: &mut diesel::serialize::Output<'b, '_, diesel::pg::Pg>,
            ) -> diesel::serialize::Result {
                <Uuid as diesel::serialize::ToSql<diesel::sql_types::Uuid, diesel::pg::Pg>>::to_sql(
                    &self.0, out,
                )
            }
        }

        impl diesel::deserialize::FromSql<diesel::sql_types::Uuid, diesel::pg::Pg> for $name {
            fn from_sql(bytes: diesel::pg::PgValue<'_>) -> diesel::deserialize::Result<Self> {
                <Uuid as diesel::deserialize::FromSql<diesel::sql_types::Uuid, diesel::pg::Pg>>::from_sql(
                    bytes,
                )
                .map($name)
            }
        }
    };
}

id_type!(
    /// A tenant: every row of every business table is scoped by it.
    AccountId
);
id_type!(
    /// An order.
    OrderId
);
id_type!(
    /// A payment (and its charge or authorization at the provider).
    PaymentId
);
id_type!(
    /// A capture or a void of a payment's authorization.
    OperationId
);
id_type!(
    /// A refund.
    RefundId
);
id_type!(
    /// An event of the outbox: what every consumer deduplicates on.
    EventId
);
id_type!(
    /// A merchant's webhook endpoint.
    EndpointId
);
id_type!(
    /// One delivery of one event to one webhook endpoint.
    DeliveryId
);
id_type!(
    /// One claim of a provider operation by a driver (a request, a retry that took it over, a
    /// reconciler), or of webhook deliveries by a delivery worker. Only the holder of the current
    /// lease may release it.
    LeaseId
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_print_and_parse_as_uuids() {
        let id = OrderId::generate();
        assert_eq!(OrderId::parse(&id.to_string()), Some(id));
        assert_eq!(serde_json::to_string(&id).unwrap(), format!("\"{id}\""));
        assert_eq!(PaymentId::parse("not-a-uuid"), None);
    }
}
