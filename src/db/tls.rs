//! TLS to PostgreSQL with rustls on ring (the provider client's stack), with libpq's `sslmode`
//! semantics:
//!
//! | sslmode | without a root certificate | with one (`sslrootcert`) |
//! |---|---|---|
//! | `prefer`, `require` | encrypted, certificate not checked | chain checked, name not |
//! | `verify-ca` | refused: needs a root | chain checked, name not |
//! | `verify-full` | refused: needs a root | chain and host name checked |
//!
//! Channel binding (SCRAM-SHA-256-PLUS) is not offered: the server is authenticated by its
//! certificate where that is asked for.

use std::sync::Arc;

use anyhow::Context;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};

use super::conninfo::{RootCert, SslMode};

/// The client configuration for `mode`, or `None` when TLS is off.
pub fn client_config(mode: SslMode, root: Option<&RootCert>) -> anyhow::Result<Option<Arc<ClientConfig>>> {
    if mode == SslMode::Disable {
        return Ok(None);
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier: Arc<dyn ServerCertVerifier> = match (mode, root) {
        (SslMode::VerifyCa | SslMode::VerifyFull, None) => anyhow::bail!(
            "sslmode={} needs trusted roots: set sslrootcert=<file> (or sslrootcert=system)",
            mode.as_str()
        ),
        (_, None) => Arc::new(AnyCertificate(provider.clone())),
        (_, Some(root)) => {
            let roots = Arc::new(load_roots(root)?);
            let chain = WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
                .build()
                .context("cannot build the certificate verifier")?;
            if mode == SslMode::VerifyFull { chain } else { Arc::new(ChainOnly(chain)) }
        }
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

/// The server name to present and check: the host as written in the URL.
pub fn server_name(host: &str) -> anyhow::Result<ServerName<'static>> {
    ServerName::try_from(host.to_owned()).with_context(|| format!("{host:?} is not a valid TLS server name"))
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

/// `prefer`/`require` without roots: encryption against passive eavesdropping only. The
/// handshake's signatures are still checked, so the session is with whoever holds the key of
/// the certificate presented.
#[derive(Debug)]
struct AnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `verify-ca` (and `require` with roots): the chain must lead to a trusted root; the name on
/// the certificate may differ from the host connected to.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        // webpki checks the chain first and the name last: a name error means the chain passed.
        match self.0.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
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
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
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
