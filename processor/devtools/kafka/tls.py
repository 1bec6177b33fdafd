"""TLS material for secured listeners: a fresh test CA, PEM for clients, PKCS12 stores for
the broker, and how a client connects (librdkafka property names)."""

from __future__ import annotations

import os
import secrets
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from processor.devtools.kafka.tools import BrokerStartError, require_tool

#: Security of the client listener: ``plaintext``; ``sasl_ssl`` (TLS, then SCRAM-SHA-512
#: with users created when the storage is formatted); ``mtls`` (TLS with
#: ``ssl.client.auth=required``: a client shows a certificate signed by the test CA).
SECURITY_MODES = ("plaintext", "sasl_ssl", "mtls")
SCRAM_MECHANISM = "SCRAM-SHA-512"
#: The user the broker itself logs in as on a SASL_SSL inter-broker listener.
BROKER_USER = "local-kafka-broker"
#: The client listener's name (and security protocol) per mode.
LISTENERS = {"plaintext": "PLAINTEXT", "sasl_ssl": "SASL_SSL", "mtls": "SSL"}
#: librdkafka property of each ``client_security`` field.
_LIBRDKAFKA_NAMES = {
    "ssl_cafile": "ssl.ca.location",
    "ssl_certfile": "ssl.certificate.location",
    "ssl_keyfile": "ssl.key.location",
    "sasl_mechanism": "sasl.mechanism",
    "sasl_username": "sasl.username",
    "sasl_password": "sasl.password",
}


def librdkafka_security(fields: Mapping[str, str]) -> dict[str, str]:
    """librdkafka properties of ``client_security`` fields (what the processor's
    kafka_io.security_config builds from the same fields; kept here so this module needs
    nothing of the processor)."""
    conf = {"security.protocol": fields.get("security_protocol", "PLAINTEXT").lower()}
    conf.update({_LIBRDKAFKA_NAMES[k]: v for k, v in fields.items()
                 if k in _LIBRDKAFKA_NAMES and v})
    return conf


@dataclass(frozen=True)
class TlsFiles:
    """A test CA and what it signed, in the formats each side reads.

    Clients (librdkafka, Python's ssl for aiokafka) read PEM: ``ca_cert``, and for mutual
    TLS ``client_cert`` / ``client_key`` (key unencrypted). The broker (Java) reads PKCS12:
    ``keystore`` (its key and chain, valid for 127.0.0.1 and localhost, usable as server
    and as client for inter-broker connections) and ``truststore`` (the CA), both under
    ``store_password``.
    """

    directory: Path
    ca_cert: Path
    client_cert: Path
    client_key: Path
    keystore: Path
    truststore: Path
    store_password: str


def make_tls_files(directory: Path, *, name: str = "local-kafka",
                   hosts: Sequence[str] = ("127.0.0.1", "localhost"),
                   valid_days: int = 2) -> TlsFiles:
    """Make a fresh CA, a broker certificate for ``hosts`` and a client certificate under
    ``directory`` (created; private keys mode 0600).

    The keys and certificates come from the ``cryptography`` package; the PKCS12
    truststore from Java's ``keytool`` (a PKCS12 store holding only a trusted certificate
    needs a Java-specific attribute that only keytool writes). Another call gives another
    CA: a client that trusts it is refused by a broker whose certificate this one signed.
    """
    import ipaddress
    from datetime import UTC, datetime, timedelta

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import pkcs12
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.now(UTC) - timedelta(minutes=5)  # tolerate small clock skew
    until = now + timedelta(days=valid_days)

    def subject(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def issue(cn: str, key: ec.EllipticCurvePrivateKey, issuer: x509.Name,
              signer: ec.EllipticCurvePrivateKey, *, ca: bool,
              usages: Sequence[x509.ObjectIdentifier] = (),
              sans: Sequence[x509.GeneralName] = ()) -> x509.Certificate:
        builder = (x509.CertificateBuilder().subject_name(subject(cn)).issuer_name(issuer)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now).not_valid_after(until)
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if usages:
            builder = builder.add_extension(x509.ExtendedKeyUsage(list(usages)), critical=False)
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(list(sans)),
                                            critical=False)
        return builder.sign(signer, hashes.SHA256())

    def pem(cert: x509.Certificate) -> bytes:
        return cert.public_bytes(serialization.Encoding.PEM)

    def write(path: Path, data: bytes, mode: int = 0o644) -> Path:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        return path

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = subject(f"{name} test CA")
    ca = issue(f"{name} test CA", ca_key, ca_name, ca_key, ca=True)
    broker_key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = []
    for host in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            sans.append(x509.DNSName(host))
    broker = issue(f"{name} broker", broker_key, ca_name, ca_key, ca=False, sans=sans,
                   usages=(ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH))
    client_key = ec.generate_private_key(ec.SECP256R1())
    client = issue(f"{name} client", client_key, ca_name, ca_key, ca=False,
                   usages=(ExtendedKeyUsageOID.CLIENT_AUTH,))

    password = secrets.token_hex(16)
    files = TlsFiles(
        directory=directory,
        ca_cert=write(directory / "ca.pem", pem(ca)),
        client_cert=write(directory / "client.pem", pem(client)),
        client_key=write(directory / "client.key", client_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption()), 0o600),
        keystore=write(directory / "broker.p12", pkcs12.serialize_key_and_certificates(
            b"broker", broker_key, broker, [ca],
            serialization.BestAvailableEncryption(password.encode())), 0o600),
        truststore=directory / "truststore.p12",
        store_password=password,
    )
    keytool = require_tool("keytool")
    files.truststore.unlink(missing_ok=True)  # keytool would add to an old store
    out = subprocess.run(
        [keytool, "-importcert", "-noprompt", "-alias", "ca", "-file", str(files.ca_cert),
         "-keystore", str(files.truststore), "-storetype", "PKCS12",
         "-storepass", password],
        capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise BrokerStartError(f"keytool could not write the truststore: {out.stdout}{out.stderr}")
    return files
