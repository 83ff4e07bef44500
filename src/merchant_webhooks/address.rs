//! Where webhooks may be sent: public addresses only, so that a merchant cannot make orderpay
//! POST into its own network (server-side request forgery). Private, loopback, link-local,
//! unspecified, shared (CGNAT), multicast, reserved, documentation and unique-local IPv6
//! addresses are refused, also when written as IPv4 inside IPv6 (mapped, compatible, NAT64,
//! 6to4), and so are the translation ranges whose IPv4 cannot be read off the address
//! (IPv4-translated `::ffff:0:0:0/96`, local-use NAT64 `64:ff9b:1::/48`, Teredo `2001::/32`).
//! `ORDERPAY_WEBHOOK_ALLOW_PRIVATE=true` turns the rule off (development and tests).
//!
//! The rule is checked twice. At creation, a literal address, or every address a name resolves
//! to, must be public ([`check_at_creation`]; a name that does not resolve is accepted then). At
//! every delivery, the address actually connected to: literal addresses before sending
//! ([`check_literal`]), names through [`PublicOnly`], the resolver of the delivery client, which
//! drops every non-public address it resolves (so a name that changed where it points since
//! creation is refused then). The delivery client follows no redirects and uses no proxy.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use url::Host;

/// Why an address is not public, or `None` when it is.
pub fn non_public(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(ip) => non_public_v4(ip),
        IpAddr::V6(ip) => non_public_v6(ip),
    }
}

fn non_public_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, c, _] = ip.octets();
    let reason = match () {
        _ if a == 0 => "an unspecified address",
        _ if ip.is_loopback() => "a loopback address",
        _ if ip.is_private() => "a private address",
        _ if ip.is_link_local() => "a link-local address",
        _ if a == 100 && (64..128).contains(&b) => "a shared (CGNAT) address",
        _ if a == 192 && b == 0 && c == 0 => "a reserved address",
        _ if a == 198 && (b == 18 || b == 19) => "a reserved address",
        // 192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24 (RFC 5737).
        _ if matches!((a, b, c), (192, 0, 2) | (198, 51, 100) | (203, 0, 113)) => "a documentation address",
        _ if ip.is_multicast() => "a multicast address",
        // 240.0.0.0/4, with the broadcast address.
        _ if a >= 240 => "a reserved address",
        _ => return None,
    };
    Some(reason)
}

fn non_public_v6(ip: Ipv6Addr) -> Option<&'static str> {
    let segments = ip.segments();
    let embedded_v4 = |high: u16, low: u16| Ipv4Addr::from((u32::from(high) << 16) | u32::from(low));
    let reason = match segments {
        _ if ip.is_unspecified() => "an unspecified address",
        _ if ip.is_loopback() => "a loopback address",
        // ::ffff:a.b.c.d (mapped), ::a.b.c.d (compatible), 64:ff9b::a.b.c.d (NAT64).
        [0, 0, 0, 0, 0, 0xffff, high, low]
        | [0, 0, 0, 0, 0, 0, high, low]
        | [0x64, 0xff9b, 0, 0, 0, 0, high, low] => return non_public_v4(embedded_v4(high, low)),
        // 2002:a.b.c.d::/48 (6to4).
        [0x2002, high, low, ..] => return non_public_v4(embedded_v4(high, low)),
        // ::ffff:0:a.b.c.d (IPv4-translated, RFC 2765), 64:ff9b:1::/48 (local-use NAT64, RFC
        // 8215: the network's own translator) and 2001::/32 (Teredo: a relay decides where it
        // goes): translated to IPv4 somewhere we cannot see.
        [0, 0, 0, 0, 0xffff, 0, ..] | [0x64, 0xff9b, 1, ..] | [0x2001, 0, ..] => "a translated address",
        // 2001:db8::/32 (RFC 3849) and 3fff::/20 (RFC 9637).
        [0x2001, 0xdb8, ..] => "a documentation address",
        [0x3fff, second, ..] if second < 0x1000 => "a documentation address",
        [first, ..] if first & 0xfe00 == 0xfc00 => "a unique-local address",
        [first, ..] if first & 0xffc0 == 0xfe80 => "a link-local address",
        [first, ..] if first & 0xffc0 == 0xfec0 => "a site-local address",
        _ if ip.is_multicast() => "a multicast address",
        _ => return None,
    };
    Some(reason)
}

/// A webhook URL that points somewhere it may not.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct NotAllowed(pub String);

/// `host` (a literal address, or a name that resolved to `resolved`) is not public.
fn refused(host: &str, resolved: Option<IpAddr>, reason: &str) -> NotAllowed {
    let what = match resolved {
        None => format!("{host} is {reason}"),
        Some(ip) => format!("{host} resolves to {ip}, {reason}"),
    };
    NotAllowed(format!("{what}; webhooks go to public addresses only"))
}

/// The URL's host, when it is a literal address.
fn literal(url: &url::Url) -> Option<IpAddr> {
    match url.host()? {
        Host::Ipv4(ip) => Some(IpAddr::V4(ip)),
        Host::Ipv6(ip) => Some(IpAddr::V6(ip)),
        Host::Domain(_) => None,
    }
}

/// Before a delivery: a literal address in the URL (which no resolver sees) must be public.
pub fn check_literal(url: &url::Url) -> Result<(), NotAllowed> {
    match literal(url) {
        Some(ip) => match non_public(ip) {
            Some(reason) => Err(refused(url.host_str().unwrap_or_default(), None, reason)),
            None => Ok(()),
        },
        None => Ok(()),
    }
}

/// At creation: a literal address must be public, and so must every address the name
/// resolves to within `timeout`. A name that does not resolve (or not in time) is accepted: it
/// may exist later, and every delivery checks where it goes.
pub async fn check_at_creation(url: &url::Url, timeout: Duration) -> Result<(), NotAllowed> {
    check_literal(url)?;
    let Some(Host::Domain(name)) = url.host() else {
        return Ok(());
    };
    let port = url.port_or_known_default().unwrap_or(443);
    let Ok(Ok(addresses)) = tokio::time::timeout(timeout, tokio::net::lookup_host((name, port))).await else {
        return Ok(());
    };
    for address in addresses {
        if let Some(reason) = non_public(address.ip()) {
            return Err(refused(name, Some(address.ip()), reason));
        }
    }
    Ok(())
}

/// The delivery client's resolver: the system's resolution, keeping public addresses only. A
/// name left with none fails the connection before anything is sent.
#[derive(Debug, Clone, Copy)]
pub struct PublicOnly;

impl Resolve for PublicOnly {
    fn resolve(&self, name: Name) -> Resolving {
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let resolved: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let public: Vec<SocketAddr> =
                resolved.iter().copied().filter(|address| non_public(address.ip()).is_none()).collect();
            match (public.is_empty(), resolved.first()) {
                (true, Some(first)) => {
                    let reason = non_public(first.ip()).unwrap_or("not public");
                    Err(Box::new(refused(&host, Some(first.ip()), reason)) as _)
                }
                _ => Ok(Box::new(public.into_iter()) as Addrs),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verdict(text: &str) -> Option<&'static str> {
        non_public(text.parse().unwrap())
    }

    #[test]
    fn non_public_addresses_of_every_kind_are_named() {
        for (address, reason) in [
            ("127.0.0.1", "a loopback address"),
            ("127.255.0.9", "a loopback address"),
            ("10.0.0.1", "a private address"),
            ("172.16.5.4", "a private address"),
            ("192.168.1.1", "a private address"),
            ("169.254.169.254", "a link-local address"),
            ("0.0.0.0", "an unspecified address"),
            ("0.1.2.3", "an unspecified address"),
            ("100.64.0.1", "a shared (CGNAT) address"),
            ("100.127.255.255", "a shared (CGNAT) address"),
            ("224.0.0.1", "a multicast address"),
            ("255.255.255.255", "a reserved address"),
            ("198.18.0.1", "a reserved address"),
            ("::1", "a loopback address"),
            ("::", "an unspecified address"),
            ("fe80::1", "a link-local address"),
            ("fc00::1", "a unique-local address"),
            ("fd12:3456::1", "a unique-local address"),
            ("ff02::1", "a multicast address"),
            ("::ffff:127.0.0.1", "a loopback address"),
            ("::ffff:169.254.169.254", "a link-local address"),
            ("::10.0.0.1", "a private address"),
            ("64:ff9b::a00:1", "a private address"),
            ("2002:a00:1::1", "a private address"),
            ("192.0.2.1", "a documentation address"),
            ("198.51.100.7", "a documentation address"),
            ("203.0.113.255", "a documentation address"),
            ("2001:db8::1", "a documentation address"),
            ("2001:db8:ffff::1", "a documentation address"),
            ("3fff::1", "a documentation address"),
            ("3fff:fff:ffff::1", "a documentation address"),
            ("::ffff:0:8.8.8.8", "a translated address"),
            ("64:ff9b:1::808:808", "a translated address"),
            ("64:ff9b:1:ffff::1", "a translated address"),
            ("2001::1", "a translated address"),
            ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "a translated address"),
            ("::ffff:192.0.2.1", "a documentation address"),
            ("64:ff9b::203.0.113.9", "a documentation address"),
        ] {
            assert_eq!(verdict(address), Some(reason), "{address}");
        }
        for public in [
            "93.184.215.14",
            "8.8.8.8",
            "100.128.0.1",
            "172.32.0.1",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
            "192.0.3.1",
            "198.51.101.1",
            "203.0.114.1",
            "2001:db9::1",
            "2001:1::1",
            "3fff:1000::1",
            "3ffe::1",
            "64:ff9b:2::1",
        ] {
            assert_eq!(verdict(public), None, "{public}");
        }
    }

    #[tokio::test]
    async fn creation_refuses_literal_and_resolved_private_addresses_and_accepts_unknown_names() {
        let check = async |text: &str| {
            check_at_creation(&url::Url::parse(text).unwrap(), Duration::from_secs(2)).await
        };
        assert!(check("http://127.0.0.1:8080/hook").await.unwrap_err().0.contains("loopback"));
        assert!(check("http://[::ffff:10.0.0.1]/").await.unwrap_err().0.contains("private"));
        assert!(check("http://localhost:9/").await.unwrap_err().0.contains("localhost resolves to"));
        assert_eq!(check("https://does-not-exist.invalid/").await, Ok(()));
        assert_eq!(check("https://93.184.215.14/").await, Ok(()));
    }

    #[tokio::test]
    async fn the_delivery_resolver_keeps_public_addresses_only() {
        let refused = PublicOnly.resolve("localhost".parse().unwrap()).await.err().unwrap();
        assert!(refused.to_string().contains("localhost resolves to 127.0.0.1"), "{refused}");
    }
}
