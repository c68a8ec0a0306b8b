"""A throw-away CA: a server certificate for localhost / 127.0.0.1 and a client certificate,
all signed by it, written as PEM files. For tests and for ``pathprobe compare`` runs that put a
configuration behind TLS on loopback; never for anything reachable from elsewhere.
Needs the ``cryptography`` package (the ``analysis`` extra)."""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> Path:
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return path


def _write_cert(cert: x509.Certificate, path: Path) -> Path:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _builder(subject: str, issuer: x509.Name, key: ec.EllipticCurvePrivateKey) -> x509.CertificateBuilder:
    now = dt.datetime.now(dt.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=2))
    )


def make_pki(folder: Path, name: str = "test") -> Pki:
    folder.mkdir(parents=True, exist_ok=True)
    ca_key = _key()
    ca_name = _name(f"pathprobe {name} CA")
    ca = (
        _builder(f"pathprobe {name} CA", ca_name, ca_key)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    aki = x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key())

    def leaf(
        cn: str, usage: x509.ObjectIdentifier, san: list[x509.GeneralName]
    ) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        key = _key()
        b = (
            _builder(cn, ca_name, key)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(aki, critical=False)
        )
        if san:
            b = b.add_extension(x509.SubjectAlternativeName(san), critical=False)
        return b.sign(ca_key, hashes.SHA256()), key

    srv, srv_key = leaf(
        "localhost",
        ExtendedKeyUsageOID.SERVER_AUTH,
        [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))],
    )
    cli, cli_key = leaf("pathprobe client", ExtendedKeyUsageOID.CLIENT_AUTH, [])
    return Pki(
        ca=_write_cert(ca, folder / "ca.pem"),
        server_cert=_write_cert(srv, folder / "server.pem"),
        server_key=_write_key(srv_key, folder / "server.key"),
        client_cert=_write_cert(cli, folder / "client.pem"),
        client_key=_write_key(cli_key, folder / "client.key"),
    )
