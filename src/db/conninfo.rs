//! `DATABASE_URL` read the way PostgreSQL's own client library reads it: a URL, with several hosts
//! when there is a standby to fail over to
//! (`postgres://user@h1:5433,h2:5434/db?target_session_attrs=read-write&sslmode=verify-full`),
//! or `key=value` pairs (`host=h1,h2 port=5433,5434 dbname=db`).
//!
//! `tokio_postgres::Config` parses all of it except the TLS parameters it does not know
//! (`sslmode=verify-ca|verify-full`, `sslrootcert`): those are taken out first and kept here, and
//! the rest is parsed by tokio-postgres, so that hosts, ports, credentials and options mean
//! exactly what they mean to it. From then on the parsed [`Conninfo`] is what is passed around.

use std::fmt;
use std::net::IpAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;

use percent_encoding::{NON_ALPHANUMERIC, percent_decode_str, utf8_percent_encode};
use tokio_postgres::Config;
use tokio_postgres::config::{Host, SslNegotiation};

/// `sslmode`, with libpq's meaning of each value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
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

const SSL_MODES: [(&str, SslMode); 5] = [
    ("disable", SslMode::Disable),
    ("prefer", SslMode::Prefer),
    ("require", SslMode::Require),
    ("verify-ca", SslMode::VerifyCa),
    ("verify-full", SslMode::VerifyFull),
];

impl SslMode {
    fn parse(value: &str) -> anyhow::Result<SslMode> {
        // `allow` tries plain first and TLS second; nothing here needs it.
        let found = SSL_MODES.iter().find(|(name, _)| *name == value).map(|(_, mode)| *mode);
        found.ok_or_else(|| {
            anyhow::anyhow!(
                "sslmode={value} is not supported (use disable, prefer, require, verify-ca or verify-full)"
            )
        })
    }

    pub fn as_str(self) -> &'static str {
        SSL_MODES.iter().find(|(_, mode)| *mode == self).map_or("", |(name, _)| name)
    }
}

/// Where trusted root certificates come from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum RootCert {
    /// A PEM file (`sslrootcert=<path>`, or libpq's default `~/.postgresql/root.crt` when present).
    File(PathBuf),
    /// The operating system's trust store (`sslrootcert=system`).
    System,
}

/// A parsed `DATABASE_URL`. Its `Display` is a URL with the password replaced by `***`.
#[derive(Debug, Clone)]
pub struct Conninfo {
    /// Everything tokio-postgres understands; its `sslmode` is irrelevant (TLS is ours: tls.rs).
    pub pg: Config,
    pub ssl_mode: SslMode,
    /// Where the roots come from, when the certificate chain is to be verified.
    pub root_cert: Option<RootCert>,
    /// The index of the host that last accepted a session, tried first next time; shared by
    /// every clone, so that all pools of the process learn it together.
    pub(super) preferred: Arc<AtomicUsize>,
}

/// One host to connect to: the name (for TLS and messages), the address to dial if `hostaddr`
/// gives one, and the port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Server {
    pub host: String,
    pub hostaddr: Option<IpAddr>,
    pub port: u16,
}

impl Server {
    pub fn tcp(host: &str, port: u16) -> Server {
        Server { host: host.to_owned(), hostaddr: None, port }
    }
}

impl fmt::Display for Server {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.host.contains(':') {
            true => write!(f, "[{}]:{}", self.host, self.port),
            false => write!(f, "{}:{}", self.host, self.port),
        }
    }
}

impl FromStr for Conninfo {
    type Err = anyhow::Error;

    fn from_str(url: &str) -> anyhow::Result<Conninfo> {
        let (rest, ssl_mode, root_cert) = take_tls_params(url)?;
        let ssl_mode = ssl_mode.map(|mode| SslMode::parse(&mode)).transpose()?;
        let root_cert = match root_cert.as_deref() {
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
        let pg =
            Config::from_str(&rest).map_err(|error| anyhow::anyhow!("DATABASE_URL is invalid: {error}"))?;
        anyhow::ensure!(
            !pg.get_hosts().is_empty() || !pg.get_hostaddrs().is_empty(),
            "DATABASE_URL names no host"
        );
        anyhow::ensure!(
            pg.get_hosts().iter().all(|host| matches!(host, Host::Tcp(_))),
            "DATABASE_URL names a Unix-domain socket: connect over TCP (host=127.0.0.1)"
        );
        if pg.get_ssl_negotiation() == SslNegotiation::Direct && ssl_mode <= SslMode::Prefer {
            anyhow::bail!("sslnegotiation=direct needs sslmode=require or stronger");
        }
        let root_cert = root_cert.or_else(|| {
            // libpq's default root file, used when it exists (verify-* without it is an error).
            let default =
                std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".postgresql/root.crt"));
            default.filter(|path| path.is_file()).map(RootCert::File)
        });
        // Refused now rather than at the first connection: verify-* without roots, unreadable roots.
        super::tls::client_config(ssl_mode, root_cert.as_ref())?;
        Ok(Conninfo { pg, ssl_mode, root_cert, preferred: Arc::default() })
    }
}

impl Conninfo {
    /// The hosts to try, in order. A single port applies to every host, as in libpq.
    pub fn servers(&self) -> Vec<Server> {
        let (hosts, hostaddrs, ports) = (self.pg.get_hosts(), self.pg.get_hostaddrs(), self.pg.get_ports());
        (0..hosts.len().max(hostaddrs.len()))
            .map(|index| {
                let hostaddr = hostaddrs.get(index).copied();
                let host = match hosts.get(index) {
                    Some(Host::Tcp(name)) => name.clone(),
                    _ => hostaddr.map(|ip| ip.to_string()).unwrap_or_default(),
                };
                let port = ports.get(index).or(if ports.len() == 1 { ports.first() } else { None });
                Server { host, hostaddr, port: port.copied().unwrap_or(5432) }
            })
            .collect()
    }

    /// This configuration with `servers` instead of its own hosts, everything else unchanged
    /// (tokio-postgres can add hosts to a `Config`, not remove them: the rest is copied).
    pub fn with_servers(&self, servers: &[Server]) -> Config {
        let pg = &self.pg;
        let mut config = Config::new();
        for server in servers {
            config.host(&server.host).port(server.port);
            server.hostaddr.map(|ip| config.hostaddr(ip));
        }
        pg.get_user().map(|user| config.user(user));
        pg.get_password().map(|password| config.password(password));
        pg.get_dbname().map(|dbname| config.dbname(dbname));
        pg.get_options().map(|options| config.options(options));
        pg.get_application_name().map(|name| config.application_name(name));
        pg.get_connect_timeout().map(|timeout| config.connect_timeout(*timeout));
        pg.get_tcp_user_timeout().map(|timeout| config.tcp_user_timeout(*timeout));
        pg.get_keepalives_interval().map(|interval| config.keepalives_interval(interval));
        pg.get_keepalives_retries().map(|retries| config.keepalives_retries(retries));
        config
            .ssl_mode(pg.get_ssl_mode())
            .ssl_negotiation(pg.get_ssl_negotiation())
            .keepalives(pg.get_keepalives())
            .keepalives_idle(pg.get_keepalives_idle())
            .target_session_attrs(pg.get_target_session_attrs())
            .channel_binding(pg.get_channel_binding())
            .load_balance_hosts(pg.get_load_balance_hosts());
        config
    }
}

impl fmt::Display for Conninfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let encode = |text| utf8_percent_encode(text, NON_ALPHANUMERIC);
        f.write_str("postgres://")?;
        if let Some(user) = self.pg.get_user() {
            let password = if self.pg.get_password().is_some() { ":***" } else { "" };
            write!(f, "{}{password}@", encode(user))?;
        }
        let servers: Vec<String> = self.servers().iter().map(Server::to_string).collect();
        write!(f, "{}/{}", servers.join(","), encode(self.pg.get_dbname().unwrap_or_default()))
    }
}

/// `text` without `sslmode` and `sslrootcert` (tokio-postgres knows only some values of the
/// one and not the other), and their values (the last one given, decoded).
fn take_tls_params(text: &str) -> anyhow::Result<(String, Option<String>, Option<String>)> {
    let text = text.trim();
    let (mut mode, mut root) = (None, None);
    let mut take = |key: &str, value: String| {
        let slot = match key {
            "sslmode" => &mut mode,
            "sslrootcert" => &mut root,
            _ => return false,
        };
        *slot = Some(value);
        true
    };
    let rest = if text.starts_with("postgres://") || text.starts_with("postgresql://") {
        // As tokio-postgres reads it: credentials run to the first `@`, then `?` starts the query.
        let hosts_at = text.find('@').unwrap_or(0);
        match text[hosts_at..].find('?').map(|at| text.split_at(hosts_at + at)) {
            None => text.to_owned(),
            Some((head, query)) => {
                let decode = |part| percent_decode_str(part).decode_utf8_lossy().into_owned();
                let kept: Vec<&str> = query[1..]
                    .split('&')
                    .filter(|pair| {
                        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
                        !pair.is_empty() && !take(&decode(key), decode(value))
                    })
                    .collect();
                if kept.is_empty() { head.to_owned() } else { format!("{head}?{}", kept.join("&")) }
            }
        }
    } else {
        let kept = parse_pairs(text)?.into_iter().filter(|(key, value)| !take(key, value.clone()));
        let quoted =
            kept.map(|(key, value)| format!("{key}='{}'", value.replace('\\', "\\\\").replace('\'', "\\'")));
        quoted.collect::<Vec<_>>().join(" ")
    };
    Ok((rest, mode, root))
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
        let quoted = chars.next_if_eq(&'\'').is_some();
        let mut value = String::new();
        loop {
            match chars.next_if(|c| quoted || !c.is_whitespace()) {
                Some('\'') if quoted => break,
                Some('\\') => value.extend(chars.next()),
                Some(c) => value.push(c),
                None if quoted => anyhow::bail!("DATABASE_URL is invalid: unterminated quote in {key}"),
                None => break,
            }
        }
        pairs.push((key, value));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_postgres::config::TargetSessionAttrs;

    fn labels(info: &Conninfo) -> Vec<String> {
        info.servers().iter().map(Server::to_string).collect()
    }

    #[test]
    fn a_failover_url_names_every_host_in_order() {
        let info: Conninfo =
            "postgres://app:pw@db1:5433,db2:5434/orders?target_session_attrs=read-write&sslmode=verify-full&sslrootcert=system"
                .parse()
                .unwrap();
        assert_eq!(labels(&info), ["db1:5433", "db2:5434"]);
        assert_eq!(info.ssl_mode, SslMode::VerifyFull);
        assert_eq!(info.pg.get_dbname(), Some("orders"));
        assert_eq!(info.pg.get_target_session_attrs(), TargetSessionAttrs::ReadWrite);
        let info: Conninfo = "host=a,b port=6000 dbname=x".parse().unwrap();
        assert_eq!(labels(&info), ["a:6000", "b:6000"], "one port applies to every host");
        assert_eq!(info.ssl_mode, SslMode::Prefer, "libpq's default");
        assert!("host=/run/postgresql dbname=x".parse::<Conninfo>().is_err(), "Unix sockets are refused");
    }

    #[test]
    fn tls_parameters_tokio_postgres_does_not_know_are_understood() {
        let (rest, mode, root) =
            take_tls_params("host=h sslmode=require sslrootcert='/my ca.pem' dbname=d").unwrap();
        let taken = (rest.as_str(), mode.as_deref(), root.as_deref());
        assert_eq!(taken, ("host='h' dbname='d'", Some("require"), Some("/my ca.pem")));
        let (rest, mode, root) =
            take_tls_params("postgres://h/d?sslrootcert=%2Ftmp%2Fca.pem&sslmode=verify-ca&a=%20").unwrap();
        assert_eq!(
            (rest.as_str(), mode.as_deref(), root.as_deref()),
            ("postgres://h/d?a=%20", Some("verify-ca"), Some("/tmp/ca.pem"))
        );
        let info: Conninfo = "postgres://h/d?sslrootcert=system".parse().unwrap();
        assert_eq!(info.ssl_mode, SslMode::VerifyFull, "system roots imply verify-full");
        for refused in [
            "sslrootcert=system&sslmode=require",
            "sslmode=allow",
            "sslmode=sometimes",
            "sslmode=verify-full&sslrootcert=/nonexistent",
        ] {
            assert!(format!("postgres://h/d?{refused}").parse::<Conninfo>().is_err(), "{refused}");
        }
    }

    #[test]
    fn passwords_are_redacted_in_every_form() {
        let redact = |url: &str| url.parse::<Conninfo>().unwrap().to_string();
        assert_eq!(redact("postgres://u:secret@h:5432/db"), "postgres://u:***@h:5432/db");
        assert_eq!(redact("postgres://u@h/db"), "postgres://u@h:5432/db");
        assert_eq!(
            redact(
                "postgresql://u:s%40cret@h1:5433,h2:5434/db?target_session_attrs=read-write&sslmode=require"
            ),
            "postgres://u:***@h1:5433,h2:5434/db"
        );
        assert_eq!(
            redact("host=h1,h2 user=u password='se cret' dbname=db"),
            "postgres://u:***@h1:5432,h2:5432/db"
        );
        assert!(
            !format!("{:?}", "user=u password=hunter2 host=h".parse::<Conninfo>().unwrap())
                .contains("hunter2")
        );
    }

    #[test]
    fn other_servers_keep_every_other_setting() {
        let url = "postgres://u:p@h1:1,h2:2/app?target_session_attrs=read-write&connect_timeout=3&keepalives_idle=9\
                   &keepalives_interval=4&keepalives_retries=5&tcp_user_timeout=6&options=-c%20x%3D1&application_name=a\
                   &channel_binding=disable&load_balance_hosts=random&sslnegotiation=direct&sslmode=require";
        let info: Conninfo = url.parse().unwrap();
        let second = info.with_servers(&info.servers()[1..]);
        let expected: Config = "postgres://u:p@h2:2/app?target_session_attrs=read-write&connect_timeout=3\
                   &keepalives_idle=9&keepalives_interval=4&keepalives_retries=5&tcp_user_timeout=6\
                   &options=-c%20x%3D1&application_name=a&channel_binding=disable&load_balance_hosts=random\
                   &sslnegotiation=direct"
            .parse()
            .unwrap();
        assert_eq!(format!("{second:?}"), format!("{expected:?}"), "every field of the Config is copied");
        assert_eq!(second.get_password(), Some(&b"p"[..]));
    }
}
