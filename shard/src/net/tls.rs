//! TLS 1.3 for the replica plane (handshake.md section 5): rustls on the ring provider, ALPN
//! `iggy-replica`, server certificates only, and the RFC 8446 exporter that binds every
//! handshake MAC to the session.
//!
//! Two modes: CA (`cert_file`/`key_file` presented, peers verified against `ca_file` under their
//! roster name) and self-signed (`self_signed = true`: the node generates its certificate at
//! boot and accepts any peer certificate, so only the pre-shared key authenticates).

use std::path::Path;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms, verify_tls13_signature};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig, SignatureScheme};
use wire::handshake::{ALPN, EXPORTER_LABEL, EXPORTER_LEN};

/// The server name a self-signed node puts in its certificate and a self-signed dialer sends
/// when a roster name is not a DNS name (any certificate is accepted in that mode).
pub const SELF_SIGNED_NAME: &str = "iggy-replica";

/// Why TLS could not be set up at boot.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM file could not be read or parsed.
    #[error("{what} {path}: {message}")]
    Pem {
        /// Which key (`cluster.tls.cert_file`, ...).
        what: &'static str,
        /// The path.
        path: String,
        /// What went wrong.
        message: String,
    },
    /// rustls refused the configuration.
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
    /// Certificate generation failed.
    #[error("self-signed certificate: {0}")]
    Generate(#[from] rcgen::Error),
    /// A roster name is not a DNS name in CA mode.
    #[error("roster name {0:?} is not a DNS name usable as a TLS server name")]
    ServerName(String),
}

/// Both sides' rustls configurations for one node.
#[derive(Debug)]
pub struct TlsConfig {
    /// The acceptor's configuration.
    pub server: Arc<ServerConfig>,
    /// The dialer's configuration.
    pub client: Arc<ClientConfig>,
    /// Whether any peer certificate is accepted.
    pub self_signed: bool,
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn pem_error(what: &'static str, path: &Path, error: impl std::fmt::Display) -> TlsError {
    TlsError::Pem {
        what,
        path: path.display().to_string(),
        message: error.to_string(),
    }
}

impl TlsConfig {
    /// CA mode: present `cert_file` (a PEM chain) with `key_file`, verify peers against
    /// `ca_file`.
    pub fn from_files(cert_file: &Path, key_file: &Path, ca_file: &Path) -> Result<Self, TlsError> {
        let chain = CertificateDer::pem_file_iter(cert_file)
            .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
            .map_err(|e| pem_error("cluster.tls.cert_file", cert_file, e))?;
        let key = PrivateKeyDer::from_pem_file(key_file)
            .map_err(|e| pem_error("cluster.tls.key_file", key_file, e))?;
        let mut roots = RootCertStore::empty();
        let cas = CertificateDer::pem_file_iter(ca_file)
            .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
            .map_err(|e| pem_error("cluster.tls.ca_file", ca_file, e))?;
        for ca in cas {
            roots.add(ca)?;
        }
        let client = ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Self::finish(chain, key, client, false)
    }

    /// Self-signed mode: a fresh certificate for [`SELF_SIGNED_NAME`] and `name`, and a dialer
    /// that accepts any certificate whose handshake signature verifies.
    pub fn self_signed(name: &str) -> Result<Self, TlsError> {
        let mut names = vec![SELF_SIGNED_NAME.to_string()];
        if ServerName::try_from(name).is_ok() && name != SELF_SIGNED_NAME {
            names.push(name.to_string());
        }
        let generated = rcgen::generate_simple_self_signed(names)?;
        let chain = vec![generated.cert.der().clone()];
        let key = PrivateKeyDer::try_from(generated.signing_key.serialize_der())
            .map_err(|e| TlsError::Rustls(rustls::Error::General(e.to_string())))?;
        let provider = provider();
        let verifier = AnyCertificate {
            algorithms: provider.signature_verification_algorithms,
        };
        let client = ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(verifier))
            .with_no_client_auth();
        Self::finish(chain, key, client, true)
    }

    fn finish(
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
        mut client: ClientConfig,
        self_signed: bool,
    ) -> Result<Self, TlsError> {
        let mut server = ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_no_client_auth()
            .with_single_cert(chain, key)?;
        server.alpn_protocols = vec![ALPN.to_vec()];
        // No resumption: every connection runs a full handshake with a fresh exporter.
        server.send_tls13_tickets = 0;
        client.alpn_protocols = vec![ALPN.to_vec()];
        client.resumption = rustls::client::Resumption::disabled();
        Ok(TlsConfig {
            server: Arc::new(server),
            client: Arc::new(client),
            self_signed,
        })
    }

    /// The server name a dialer sends to the peer named `name` in the roster.
    pub fn server_name(&self, name: &str) -> Result<ServerName<'static>, TlsError> {
        match ServerName::try_from(name.to_string()) {
            Ok(server_name @ ServerName::DnsName(_)) => Ok(server_name),
            _ if self.self_signed => Ok(ServerName::try_from(SELF_SIGNED_NAME)
                .expect("a DNS name")
                .to_owned()),
            _ => Err(TlsError::ServerName(name.to_string())),
        }
    }
}

/// The exporter value of an established session (handshake.md section 5).
pub fn exporter<D>(
    session: &rustls::ConnectionCommon<D>,
) -> Result<[u8; EXPORTER_LEN], rustls::Error> {
    session.export_keying_material([0u8; EXPORTER_LEN], EXPORTER_LABEL, None)
}

/// Self-signed mode's verifier: any certificate, but the TLS 1.3 handshake signature must
/// verify under it, so the session key still belongs to whoever presented the certificate
/// (which the PSK MAC over the exporter then ties to a cluster member).
#[derive(Debug)]
struct AnyCertificate {
    algorithms: WebPkiSupportedAlgorithms,
}

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
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        // The configuration allows TLS 1.3 only.
        Err(rustls::Error::PeerIncompatible(
            rustls::PeerIncompatible::Tls12NotOffered,
        ))
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}
