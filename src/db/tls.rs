//! TLS to PostgreSQL with rustls on ring (the provider client's stack), with libpq's `sslmode`
//! semantics, and the connector tokio-postgres hands every new socket to:
//!
//! | sslmode | without a root certificate | with one (`sslrootcert`) |
//! |---|---|---|
//! | `prefer`, `require` | encrypted, certificate not checked | chain checked, name not |
//! | `verify-ca` | refused: needs a root | chain checked, name not |
//! | `verify-full` | refused: needs a root | chain and host name checked |
//!
//! tokio-postgres knows neither `verify-*` nor a plain session it does not negotiate itself, so
//! it is told to use direct TLS ([`Negotiate`]): every socket comes to us, we negotiate as
//! `sslmode` says (PostgreSQL's SSLRequest, or direct TLS with `sslnegotiation=direct`), and hand
//! back the stream with the watch of wire.rs on top, TLS or not. Channel binding
//! (SCRAM-SHA-256-PLUS) is not offered: the server is authenticated by its certificate where that
//! is asked for.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::Duration;

use anyhow::Context;
use bytes::BytesMut;
use postgres_protocol::message::frontend;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio_postgres::Socket;
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_rustls::TlsConnector;

use super::conninfo::{RootCert, SslMode};
use super::wire::Watched;

/// A socket, under TLS or not.
pub trait Io: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}

/// How every new connection of one session kind starts: [`MakeTlsConnect`] for tokio-postgres.
#[derive(Clone)]
pub struct Negotiate {
    mode: SslMode,
    /// `sslnegotiation=direct`: TLS at once, without PostgreSQL's SSLRequest.
    direct: bool,
    tls: Option<Arc<ClientConfig>>,
    /// The watch's bound on each answer (wire.rs).
    answer_bound: Option<Duration>,
    /// The host name to present and check; set per host by tokio-postgres.
    host: String,
}

impl Negotiate {
    pub fn new(
        mode: SslMode,
        root: Option<&RootCert>,
        direct: bool,
        answer_bound: Option<Duration>,
    ) -> anyhow::Result<Negotiate> {
        let tls = client_config(mode, root)?;
        Ok(Negotiate { mode, direct, tls, answer_bound, host: String::new() })
    }

    async fn start(self, mut socket: Socket) -> io::Result<Watched<Box<dyn Io>>> {
        let tls = match &self.tls {
            Some(tls) if self.direct || self.server_takes_tls(&mut socket).await? => tls.clone(),
            _ => return Ok(Watched::new(Box::new(socket), self.answer_bound)),
        };
        let name = ServerName::try_from(self.host.clone()).map_err(io::Error::other)?;
        let stream = TlsConnector::from(tls).connect(name, socket).await?;
        Ok(Watched::new(Box::new(stream), self.answer_bound))
    }

    /// PostgreSQL's SSLRequest: whether the server takes TLS; an error if it must and does not.
    async fn server_takes_tls(&self, socket: &mut Socket) -> io::Result<bool> {
        let mut request = BytesMut::new();
        frontend::ssl_request(&mut request);
        socket.write_all(&request).await?;
        match socket.read_u8().await? {
            b'S' => Ok(true),
            b'N' if self.mode == SslMode::Prefer => Ok(false),
            answer => Err(io::Error::other(format!(
                "sslmode={} requires TLS, and the server answered {:?} to the request",
                self.mode.as_str(),
                char::from(answer)
            ))),
        }
    }
}

impl MakeTlsConnect<Socket> for Negotiate {
    type Stream = Watched<Box<dyn Io>>;
    type TlsConnect = Negotiate;
    type Error = io::Error;

    fn make_tls_connect(&mut self, host: &str) -> io::Result<Negotiate> {
        Ok(Negotiate { host: host.to_owned(), ..self.clone() })
    }
}

impl TlsConnect<Socket> for Negotiate {
    type Stream = Watched<Box<dyn Io>>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Self::Stream>> + Send>>;

    fn connect(self, socket: Socket) -> Self::Future {
        Box::pin(self.start(socket))
    }
}

/// Client configurations by `sslmode` and roots, built once per process (certificates read once).
type Configs = HashMap<(SslMode, Option<RootCert>), Option<Arc<ClientConfig>>>;
static CONFIGS: LazyLock<Mutex<Configs>> = LazyLock::new(Mutex::default);

/// The client configuration for `mode`, or `None` when TLS is off.
pub fn client_config(mode: SslMode, root: Option<&RootCert>) -> anyhow::Result<Option<Arc<ClientConfig>>> {
    let mut configs = CONFIGS.lock().unwrap_or_else(PoisonError::into_inner);
    let key = (mode, root.cloned());
    if let Some(config) = configs.get(&key) {
        return Ok(config.clone());
    }
    let config = build(mode, root)?;
    configs.insert(key, config.clone());
    Ok(config)
}

fn build(mode: SslMode, root: Option<&RootCert>) -> anyhow::Result<Option<Arc<ClientConfig>>> {
    if mode == SslMode::Disable {
        return Ok(None);
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = match (mode, root) {
        (SslMode::VerifyCa | SslMode::VerifyFull, None) => anyhow::bail!(
            "sslmode={} needs trusted roots: set sslrootcert=<file> (or sslrootcert=system)",
            mode.as_str()
        ),
        (_, None) => None,
        (_, Some(root)) => Some(
            WebPkiServerVerifier::builder_with_provider(Arc::new(load_roots(root)?), provider.clone())
                .build()
                .context("cannot build the certificate verifier")?,
        ),
    };
    let verifier: Arc<dyn ServerCertVerifier> = match chain {
        Some(chain) if mode == SslMode::VerifyFull => chain,
        chain => Arc::new(Lenient { chain, provider: provider.clone() }),
    };
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("rustls has no usable protocol version")?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    // What PostgreSQL 17+ expects (and requires for direct TLS); older servers ignore it.
    config.alpn_protocols = vec![b"postgresql".to_vec()];
    Ok(Some(Arc::new(config)))
}

fn load_roots(root: &RootCert) -> anyhow::Result<RootCertStore> {
    let certificates: Vec<CertificateDer<'static>> = match root {
        RootCert::File(path) => CertificateDer::pem_file_iter(path)
            .and_then(|certificates| certificates.collect::<Result<_, _>>())
            .with_context(|| format!("cannot read root certificates from {}", path.display()))?,
        RootCert::System => {
            let found = rustls_native_certs::load_native_certs();
            if found.certs.is_empty() {
                anyhow::bail!("no system root certificates found: {:?}", found.errors);
            }
            found.certs
        }
    };
    let mut store = RootCertStore::empty();
    let (added, _ignored) = store.add_parsable_certificates(certificates);
    anyhow::ensure!(added > 0, "no usable root certificate in {root:?}");
    Ok(store)
}

/// What `sslmode` below verify-full checks. Without roots (`prefer`, `require`): no chain, which
/// encrypts against passive eavesdropping only; with roots (`verify-ca`, and `require` given a
/// root): the chain must lead to a trusted root, and the name on the certificate may differ from
/// the host. The handshake's signatures are checked either way, so the session is with whoever
/// holds the key of the certificate presented.
#[derive(Debug)]
struct Lenient {
    chain: Option<Arc<WebPkiServerVerifier>>,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for Lenient {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(chain) = &self.chain else { return Ok(ServerCertVerified::assertion()) };
        // webpki checks the chain first and the name last: a name error means the chain passed.
        match chain.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algorithms = &self.provider.signature_verification_algorithms;
        rustls::crypto::verify_tls12_signature(message, cert, dss, algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algorithms = &self.provider.signature_verification_algorithms;
        rustls::crypto::verify_tls13_signature(message, cert, dss, algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verification_without_roots_is_refused_up_front() {
        for mode in [SslMode::VerifyCa, SslMode::VerifyFull] {
            let error = client_config(mode, None).unwrap_err().to_string();
            assert!(error.contains("sslrootcert"), "{error}");
        }
        assert!(client_config(SslMode::Disable, None).unwrap().is_none());
        assert!(client_config(SslMode::Require, None).unwrap().is_some());
    }

    #[test]
    fn an_unreadable_root_file_is_a_clean_error() {
        let missing = RootCert::File("/nonexistent/root.crt".into());
        let error = client_config(SslMode::VerifyFull, Some(&missing)).unwrap_err();
        assert!(format!("{error:#}").contains("/nonexistent/root.crt"), "{error:#}");
    }
}
