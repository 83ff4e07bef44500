//! `DATABASE_URL` read the way PostgreSQL's own client library reads it: a URL, with several hosts
//! when there is a standby to fail over to
//! (`postgres://user@h1:5433,h2:5434/db?target_session_attrs=read-write&sslmode=verify-full`),
//! or `key=value` pairs (`host=h1,h2 port=5433,5434 dbname=db`).
//!
//! `tokio_postgres::Config` parses all of it except the TLS parameters it does not know
//! (`sslmode=verify-ca|verify-full`, `sslrootcert`): those are taken out first and kept here, and
//! the rest is parsed by tokio-postgres, so that hosts, ports, credentials and options mean
//! exactly what they mean to it.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::str::FromStr;

use tokio_postgres::config::{Host, TargetSessionAttrs};

/// `sslmode`, with libpq's meaning of each value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum SslMode {
    /// Plain TCP.
    Disable,
    /// TLS when the server offers it, else plain (libpq's default).
    Prefer,
    /// TLS or nothing; the certificate is not checked unless a root certificate is given.
    Require,
    /// TLS with a certificate chain to a trusted root; the host name is not checked.
    VerifyCa,
    /// TLS with a certificate chain to a trusted root, issued for the host connected to.
    VerifyFull,
}

impl SslMode {
    fn parse(value: &str) -> anyhow::Result<SslMode> {
        Ok(match value {
            "disable" => SslMode::Disable,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            // `allow` tries plain first and TLS second; nothing here needs it.
            other => anyhow::bail!(
                "sslmode={other} is not supported (use disable, prefer, require, verify-ca or verify-full)"
            ),
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }
}

/// Where trusted root certificates come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RootCert {
    /// A PEM file (`sslrootcert=<path>`, or libpq's default `~/.postgresql/root.crt` when present).
    File(PathBuf),
    /// The operating system's trust store (`sslrootcert=system`).
    System,
}

/// A parsed `DATABASE_URL`.
#[derive(Debug, Clone)]
pub struct Conninfo {
    /// Everything tokio-postgres understands; its `sslmode` is irrelevant (TLS is ours).
    pub pg: tokio_postgres::Config,
    pub ssl_mode: SslMode,
    /// Where the roots come from, when the certificate chain is to be verified.
    pub root_cert: Option<RootCert>,
}

impl FromStr for Conninfo {
    type Err = anyhow::Error;

    fn from_str(url: &str) -> anyhow::Result<Conninfo> {
        let mut raw = Raw::parse(url)?;
        let ssl_mode = raw.take("sslmode").map(|mode| SslMode::parse(&mode)).transpose()?;
        let root_cert = match raw.take("sslrootcert").as_deref() {
            Some("system") => Some(RootCert::System),
            Some("") | None => None,
            Some(path) => Some(RootCert::File(PathBuf::from(path))),
        };
        // libpq: `system` means verify-full, and refuses anything weaker.
        let ssl_mode = match (ssl_mode, &root_cert) {
            (None, Some(RootCert::System)) => SslMode::VerifyFull,
            (Some(mode), Some(RootCert::System)) if mode != SslMode::VerifyFull => {
                anyhow::bail!("sslrootcert=system requires sslmode=verify-full (not {})", mode.as_str())
            }
            (mode, _) => mode.unwrap_or(SslMode::Prefer),
        };
        let pg = tokio_postgres::Config::from_str(&raw.render())
            .map_err(|error| anyhow::anyhow!("DATABASE_URL is invalid: {error}"))?;
        anyhow::ensure!(
            !pg.get_hosts().is_empty() || !pg.get_hostaddrs().is_empty(),
            "DATABASE_URL names no host"
        );
        let root_cert = root_cert.or_else(|| {
            // libpq's default root file, used when it exists (verify-* without it is an error later).
            let default =
                std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".postgresql/root.crt"));
            default.filter(|path| path.is_file()).map(RootCert::File)
        });
        Ok(Conninfo { pg, ssl_mode, root_cert })
    }
}

impl Conninfo {
    /// How many hosts to try, in order.
    pub fn host_count(&self) -> usize {
        self.pg.get_hosts().len().max(self.pg.get_hostaddrs().len())
    }

    /// The `index`-th host: its name (for TLS and messages), the address to dial if `hostaddr`
    /// gives one, and its port. A single port applies to every host, as in libpq.
    pub fn host(&self, index: usize) -> (Host, Option<std::net::IpAddr>, u16) {
        let hostaddr = self.pg.get_hostaddrs().get(index).copied();
        let host = match self.pg.get_hosts().get(index) {
            Some(host) => host.clone(),
            None => Host::Tcp(hostaddr.map(|ip| ip.to_string()).unwrap_or_default()),
        };
        let ports = self.pg.get_ports();
        let port = ports.get(index).or(if ports.len() == 1 { ports.first() } else { None });
        (host, hostaddr, port.copied().unwrap_or(5432))
    }

    /// `host:port` of the `index`-th host, for messages.
    pub fn host_label(&self, index: usize) -> String {
        let (host, _, port) = self.host(index);
        match host {
            Host::Tcp(name) if name.contains(':') => format!("[{name}]:{port}"),
            Host::Tcp(name) => format!("{name}:{port}"),
            Host::Unix(path) => format!("{}/.s.PGSQL.{port}", path.display()),
        }
    }

    /// The connection string as a URL with the password replaced by `***`: safe for logs.
    pub fn redacted(&self) -> String {
        let mut out = String::from("postgres://");
        if let Some(user) = self.pg.get_user() {
            out.push_str(&encode(user));
            if self.pg.get_password().is_some() {
                out.push_str(":***");
            }
            out.push('@');
        }
        let ports = self.pg.get_ports();
        for index in 0..self.host_count() {
            if index > 0 {
                out.push(',');
            }
            let (host, _, port) = self.host(index);
            match host {
                Host::Tcp(name) if name.contains(':') => {
                    let _ = write!(out, "[{name}]");
                }
                Host::Tcp(name) => out.push_str(&encode(&name)),
                Host::Unix(path) => out.push_str(&encode(&path.to_string_lossy())),
            }
            if !ports.is_empty() {
                let _ = write!(out, ":{port}");
            }
        }
        if let Some(dbname) = self.pg.get_dbname() {
            out.push('/');
            out.push_str(&encode(dbname));
        }
        let mut params = Vec::new();
        if self.ssl_mode != SslMode::Prefer {
            params.push(format!("sslmode={}", self.ssl_mode.as_str()));
        }
        match &self.root_cert {
            Some(RootCert::System) => params.push("sslrootcert=system".to_owned()),
            Some(RootCert::File(path)) => {
                params.push(format!("sslrootcert={}", encode(&path.to_string_lossy())))
            }
            None => {}
        }
        match self.pg.get_target_session_attrs() {
            TargetSessionAttrs::ReadWrite => params.push("target_session_attrs=read-write".to_owned()),
            TargetSessionAttrs::ReadOnly => params.push("target_session_attrs=read-only".to_owned()),
            _ => {}
        }
        if !params.is_empty() {
            out.push('?');
            out.push_str(&params.join("&"));
        }
        out
    }
}

/// `url` naming database `name` instead, everything else unchanged (same hosts, credentials and
/// parameters), in the same form (URL or key=value).
pub fn with_database(url: &str, name: &str) -> anyhow::Result<String> {
    let mut raw = Raw::parse(url)?;
    raw.take("dbname");
    match &mut raw {
        Raw::Url { path, .. } => *path = encode(name),
        Raw::Pairs(pairs) => pairs.push(("dbname".to_owned(), name.to_owned())),
    }
    let renamed = raw.render();
    // Checked with the parser that will read it.
    let parsed = tokio_postgres::Config::from_str(&raw_without_tls(&renamed)?)
        .map_err(|error| anyhow::anyhow!("DATABASE_URL is invalid: {error}"))?;
    anyhow::ensure!(parsed.get_dbname() == Some(name), "could not name database {name} in DATABASE_URL");
    Ok(renamed)
}

fn raw_without_tls(url: &str) -> anyhow::Result<String> {
    let mut raw = Raw::parse(url)?;
    raw.take("sslmode");
    raw.take("sslrootcert");
    Ok(raw.render())
}

/// The string split just enough to take parameters out and put it back together; values stay
/// as written (percent-encoded in URLs) except those taken.
#[derive(Debug)]
enum Raw {
    Url {
        /// Scheme, credentials and hosts, as written: `postgres://u:p@h1:1,h2:2`.
        head: String,
        /// The database name, as written (percent-encoded), without the `/`.
        path: String,
        /// Query parameters, as written.
        params: Vec<(String, String)>,
    },
    /// `key=value` pairs, unquoted.
    Pairs(Vec<(String, String)>),
}

impl Raw {
    fn parse(url: &str) -> anyhow::Result<Raw> {
        let url = url.trim();
        let Some(rest) = url.strip_prefix("postgres://").or_else(|| url.strip_prefix("postgresql://")) else {
            return Ok(Raw::Pairs(parse_pairs(url)?));
        };
        let scheme = &url[..url.len() - rest.len()];
        // As tokio-postgres does: credentials run to the first `@`, hosts to the next `/` or `?`.
        let hosts_start = rest.find('@').map_or(0, |at| at + 1);
        let hosts_end = rest[hosts_start..].find(['/', '?']).map_or(rest.len(), |end| hosts_start + end);
        let head = format!("{scheme}{}", &rest[..hosts_end]);
        let tail = &rest[hosts_end..];
        let (path, query) = match tail.split_once('?') {
            Some((path, query)) => (path, query),
            None => (tail, ""),
        };
        let params = query
            .split('&')
            .filter(|pair| !pair.is_empty())
            .map(|pair| match pair.split_once('=') {
                Some((key, value)) => (key.to_owned(), value.to_owned()),
                None => (pair.to_owned(), String::new()),
            })
            .collect();
        Ok(Raw::Url { head, path: path.trim_start_matches('/').to_owned(), params })
    }

    /// Removes every occurrence of `key`; returns the last value, decoded.
    fn take(&mut self, key: &str) -> Option<String> {
        let mut taken = None;
        match self {
            Raw::Url { params, .. } => params.retain(|(name, value)| {
                if decode(name) == key {
                    taken = Some(decode(value));
                    false
                } else {
                    true
                }
            }),
            Raw::Pairs(pairs) => pairs.retain(|(name, value)| {
                if name == key {
                    taken = Some(value.clone());
                    false
                } else {
                    true
                }
            }),
        }
        taken
    }

    fn render(&self) -> String {
        match self {
            Raw::Url { head, path, params } => {
                let mut out = head.clone();
                if !path.is_empty() || !params.is_empty() {
                    out.push('/');
                    out.push_str(path);
                }
                for (index, (key, value)) in params.iter().enumerate() {
                    out.push(if index == 0 { '?' } else { '&' });
                    let _ = write!(out, "{key}={value}");
                }
                out
            }
            Raw::Pairs(pairs) => pairs
                .iter()
                .map(|(key, value)| format!("{key}='{}'", value.replace('\\', "\\\\").replace('\'', "\\'")))
                .collect::<Vec<_>>()
                .join(" "),
        }
    }
}

/// libpq's `key = value` syntax: values may be single-quoted, with `\` escaping.
fn parse_pairs(text: &str) -> anyhow::Result<Vec<(String, String)>> {
    let mut pairs = Vec::new();
    let mut chars = text.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.peek().is_none() {
            return Ok(pairs);
        }
        let mut key = String::new();
        while let Some(c) = chars.next_if(|c| *c != '=' && !c.is_whitespace()) {
            key.push(c);
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        anyhow::ensure!(chars.next() == Some('='), "DATABASE_URL is invalid: {key} has no value");
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        if chars.next_if_eq(&'\'').is_some() {
            loop {
                match chars.next() {
                    Some('\'') => break,
                    Some('\\') => value.extend(chars.next()),
                    Some(c) => value.push(c),
                    None => anyhow::bail!("DATABASE_URL is invalid: unterminated quote in {key}"),
                }
            }
        } else {
            while let Some(c) = chars.next_if(|c| !c.is_whitespace()) {
                if c == '\\' {
                    value.extend(chars.next());
                } else {
                    value.push(c);
                }
            }
        }
        pairs.push((key, value));
    }
}

/// Percent-decoding of URL parts (invalid escapes are kept as written).
fn decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        let escaped = (bytes[index] == b'%')
            .then(|| bytes.get(index + 1..index + 3))
            .flatten()
            .and_then(|hex| std::str::from_utf8(hex).ok())
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match escaped {
            Some(byte) => {
                out.push(byte);
                index += 3;
            }
            None => {
                out.push(bytes[index]);
                index += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Percent-encoding of everything but RFC 3986's unreserved characters.
fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(byte as char);
        } else {
            let _ = write!(out, "%{byte:02X}");
        }
    }
    out
}

/// For error messages: the URL redacted, or a placeholder when it does not parse.
pub fn redact(url: &str) -> String {
    url.parse::<Conninfo>().map_or_else(|_| "<unparseable DATABASE_URL>".to_owned(), |info| info.redacted())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failover_url_names_every_host_in_order() {
        let info: Conninfo =
            "postgres://app:pw@db1:5433,db2:5434/orders?target_session_attrs=read-write&sslmode=verify-full"
                .parse()
                .unwrap();
        assert_eq!(info.host_count(), 2);
        assert_eq!(info.host_label(0), "db1:5433");
        assert_eq!(info.host_label(1), "db2:5434");
        assert_eq!(info.ssl_mode, SslMode::VerifyFull);
        assert_eq!(info.pg.get_dbname(), Some("orders"));
        assert_eq!(info.pg.get_target_session_attrs(), TargetSessionAttrs::ReadWrite);
    }

    #[test]
    fn one_port_applies_to_every_host() {
        let info: Conninfo = "host=a,b port=6000 dbname=x".parse().unwrap();
        assert_eq!((info.host_label(0), info.host_label(1)), ("a:6000".to_owned(), "b:6000".to_owned()));
        assert_eq!(info.ssl_mode, SslMode::Prefer, "libpq's default");
    }

    #[test]
    fn tls_parameters_tokio_postgres_does_not_know_are_understood() {
        let info: Conninfo =
            "host=h sslmode=verify-ca sslrootcert='/etc/my ca.pem' dbname=d".parse().unwrap();
        assert_eq!(info.ssl_mode, SslMode::VerifyCa);
        assert_eq!(info.root_cert, Some(RootCert::File("/etc/my ca.pem".into())));
        let info: Conninfo = "postgres://h/d?sslrootcert=%2Ftmp%2Fca.pem&sslmode=require".parse().unwrap();
        assert_eq!(info.root_cert, Some(RootCert::File("/tmp/ca.pem".into())));
        let info: Conninfo = "postgres://h/d?sslrootcert=system".parse().unwrap();
        assert_eq!(info.ssl_mode, SslMode::VerifyFull, "system roots imply verify-full");
        assert!("postgres://h/d?sslrootcert=system&sslmode=require".parse::<Conninfo>().is_err());
        assert!("postgres://h/d?sslmode=allow".parse::<Conninfo>().is_err());
        assert!("postgres://h/d?sslmode=sometimes".parse::<Conninfo>().is_err());
    }

    #[test]
    fn passwords_are_redacted_in_every_form() {
        assert_eq!(redact("postgres://u:secret@h:5432/db"), "postgres://u:***@h:5432/db");
        assert_eq!(redact("postgres://u@h/db"), "postgres://u@h:5432/db");
        assert_eq!(
            redact(
                "postgresql://u:s%40cret@h1:5433,h2:5434/db?target_session_attrs=read-write&sslmode=require"
            ),
            "postgres://u:***@h1:5433,h2:5434/db?sslmode=require&target_session_attrs=read-write"
        );
        let redacted = redact("host=h1,h2 user=u password='se cret' dbname=db");
        assert_eq!(redacted, "postgres://u:***@h1,h2/db");
        assert!(!redact("user=u password=hunter2 host=h").contains("hunter2"));
        assert_eq!(redact("postgres://u:hunter2@h/db?nonsense=1"), "<unparseable DATABASE_URL>");
    }

    #[test]
    fn another_database_keeps_hosts_credentials_and_parameters() {
        assert_eq!(
            with_database(
                "postgres://u:p@h1:1,h2:2/app?sslmode=verify-full&target_session_attrs=read-write",
                "postgres"
            )
            .unwrap(),
            "postgres://u:p@h1:1,h2:2/postgres?sslmode=verify-full&target_session_attrs=read-write"
        );
        assert_eq!(with_database("postgres://h", "x y").unwrap(), "postgres://h/x%20y");
        assert_eq!(with_database("postgres://h/a?dbname=b", "c").unwrap(), "postgres://h/c");
        let pairs = with_database("host=h dbname=a sslmode=verify-ca", "b").unwrap();
        assert_eq!(pairs, "host='h' sslmode='verify-ca' dbname='b'");
        let info: Conninfo = pairs.parse().unwrap();
        assert_eq!((info.pg.get_dbname(), info.ssl_mode), (Some("b"), SslMode::VerifyCa));
    }
}
