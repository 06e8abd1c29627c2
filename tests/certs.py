"""Test credentials made at test time: a throwaway PKI (CA, server and client certificates) and
NATS nkeys and JWTs for operator mode (`.creds` files)."""

from __future__ import annotations

import base64
import datetime
import hashlib
import ipaddress
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nkeys
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# TLS


@dataclass(frozen=True)
class Pki:
    """Paths of the PEM files, and of a second CA that signed none of them (an untrusted one)."""

    ca_cert: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca_cert: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> Path:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)
    return path


def _write_cert(cert: x509.Certificate, path: Path) -> Path:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


def _builder(
    subject: str, issuer: x509.Name, key: ec.EllipticCurvePrivateKey
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=2))
    )


def _ca(common_name: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    usage = x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=True,
        crl_sign=True,
        encipher_only=False,
        decipher_only=False,
    )
    cert = (
        _builder(common_name, _name(common_name), key)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(usage, critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _leaf(
    common_name: str,
    ca: tuple[x509.Certificate, ec.EllipticCurvePrivateKey],
    usage: x509.ObjectIdentifier,
    names: list[x509.GeneralName],
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    ca_cert, ca_key = ca
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (
        _builder(common_name, ca_cert.subject, key)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(ca_key, hashes.SHA256()), key


def make_pki(directory: Path) -> Pki:
    """Write a CA, a server cert for 127.0.0.1/localhost and a client cert under `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = _ca("nats-spark test CA")
    server_cert, server_key = _leaf(
        "nats-spark test server",
        ca,
        ExtendedKeyUsageOID.SERVER_AUTH,
        [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))],
    )
    client_cert, client_key = _leaf(
        "nats-spark test client", ca, ExtendedKeyUsageOID.CLIENT_AUTH, []
    )
    other_ca, _ = _ca("nats-spark untrusted CA")
    return Pki(
        ca_cert=_write_cert(ca[0], directory / "ca.pem"),
        server_cert=_write_cert(server_cert, directory / "server.pem"),
        server_key=_write_key(server_key, directory / "server-key.pem"),
        client_cert=_write_cert(client_cert, directory / "client.pem"),
        client_key=_write_key(client_key, directory / "client-key.pem"),
        other_ca_cert=_write_cert(other_ca, directory / "other-ca.pem"),
    )


def tls_config(pki: Pki, verify: bool) -> str:
    """A nats-server `tls` block; `verify` demands client certificates (mutual TLS)."""
    return json.dumps(
        {
            "tls": {
                "cert_file": str(pki.server_cert),
                "key_file": str(pki.server_key),
                "ca_file": str(pki.ca_cert),
                "verify": verify,
                "timeout": 2,
            }
        }
    )


# NATS nkeys and JWTs


def new_nkey(prefix: int) -> nkeys.KeyPair:
    """A fresh key pair of a role: `nkeys.PREFIX_BYTE_USER`, `_ACCOUNT` or `_OPERATOR`."""
    return nkeys.from_seed(nkeys.encode_seed(os.urandom(32), prefix))


def public(key: nkeys.KeyPair) -> str:
    return key.public_key.decode()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def jwt(issuer: nkeys.KeyPair, subject: str, name: str, nats: dict[str, Any]) -> str:
    """A NATS JWT: base64url(header).base64url(claims).base64url(ed25519 signature)."""
    claims: dict[str, Any] = {
        "jti": "",
        "iat": int(time.time()),
        "iss": public(issuer),
        "name": name,
        "sub": subject,
        "nats": {**nats, "version": 2},
    }
    digest = hashlib.sha256(json.dumps(claims, sort_keys=True).encode()).digest()
    claims["jti"] = base64.b32encode(digest).rstrip(b"=").decode()
    header = _b64(json.dumps({"typ": "JWT", "alg": "ed25519-nkey"}).encode())
    body = _b64(json.dumps(claims).encode())
    signature = issuer.sign(f"{header}.{body}".encode())
    return f"{header}.{body}.{_b64(signature)}"


_UNLIMITED = {
    "subs": -1,
    "data": -1,
    "payload": -1,
    "imports": -1,
    "exports": -1,
    "wildcards": True,
    "conn": -1,
    "leaf": -1,
}
_JETSTREAM = {"mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1}


@dataclass(frozen=True)
class OperatorSetup:
    """An operator-mode server config (memory resolver) and a user's `.creds` file."""

    config: str
    creds: Path
    account: nkeys.KeyPair


def creds_file(path: Path, account: nkeys.KeyPair, user: nkeys.KeyPair) -> Path:
    """A `.creds` file for `user`, signed by `account`."""
    token = jwt(
        account,
        public(user),
        "spark",
        {"type": "user", "pub": {}, "sub": {}, "subs": -1, "data": -1, "payload": -1},
    )
    path.write_text(
        f"-----BEGIN NATS USER JWT-----\n{token}\n------END NATS USER JWT------\n\n"
        f"-----BEGIN USER NKEY SEED-----\n{user.seed.decode()}\n------END USER NKEY SEED------\n"
    )
    path.chmod(0o600)
    return path


def operator_setup(directory: Path) -> OperatorSetup:
    """Operator, a system account, a JetStream-enabled account and one of its users."""
    operator = new_nkey(nkeys.PREFIX_BYTE_OPERATOR)
    system = new_nkey(nkeys.PREFIX_BYTE_ACCOUNT)
    account = new_nkey(nkeys.PREFIX_BYTE_ACCOUNT)
    accounts = {
        public(system): jwt(
            operator, public(system), "SYS", {"type": "account", "limits": _UNLIMITED}
        ),
        public(account): jwt(
            operator,
            public(account),
            "APP",
            {"type": "account", "limits": {**_UNLIMITED, **_JETSTREAM}},
        ),
    }
    config = json.dumps(
        {
            "operator": jwt(operator, public(operator), "OP", {"type": "operator"}),
            "system_account": public(system),
            "resolver": "MEMORY",
            "resolver_preload": accounts,
        }
    )
    creds = creds_file(directory / "spark.creds", account, new_nkey(nkeys.PREFIX_BYTE_USER))
    return OperatorSetup(config, creds, account)
