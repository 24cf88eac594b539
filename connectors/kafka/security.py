"""A source's ``security`` section in each Kafka client's own spelling: librdkafka and Spark's Java client.

The daemon has two kinds of Kafka client. librdkafka (confluent-kafka) makes the admin client, the
driver's small live reads, the Python connector's readers, the Parquet copy and ``verify``; Spark's Java
client reads the live stream and history with ``connector = "spark"``. They name the same settings
differently, and each refuses the other's (librdkafka: "Java JAAS configuration is not supported", "Java
TrustStores are not supported"), so one map of options cannot serve both. One section
(:class:`~source_backfill.config.KafkaSecurity`) is translated here, once per client:

==================  ====================================  ===========================================
setting             librdkafka                            Java client
==================  ====================================  ===========================================
SASL user/password  ``sasl.username``, ``sasl.password``  ``sasl.jaas.config`` (the login module's line)
private CA          ``ssl.ca.pem``                        ``ssl.truststore.type = PEM``, ``…certificates``
client certificate  ``ssl.certificate.pem``, ``…key.pem`` ``ssl.keystore.type = PEM``, ``…key``, ``…chain``
hostname check      ``ssl.endpoint.identification…``     the same name (``https`` or empty)
==================  ====================================  ===========================================

Certificates, keys and passwords go inline, read from their files (or the password's environment
variable) each time a client's options are made, so a Spark executor on another host needs no file, and a
rotated secret is read by the next client. Inline, they are in the readers' options: the daemon's Spark
conf redacts those keys in plans and the UI (``spark.sql.redaction.options.regex``,
:data:`REDACTED_OPTIONS`), and nothing here logs a value.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from source_backfill.config import KafkaSecurity, SourceConfig
from source_backfill.errors import ConfigError

#: The option keys that carry a secret, in both clients' spellings (with or without ``kafka.``): Spark
#: redacts options matching this in plans and the UI (``runtime/spark.py``).
REDACTED_OPTIONS = r"(?i)url|password|secret|token|jaas\.config|ssl\.key\.pem|ssl\.keystore\.key"

#: The DER of PBES2's object identifier (1.2.840.113549.1.5.13): an encrypted PKCS#8 key using it (OpenSSL's
#: default) is one Java's PEM key store cannot read.
_PBES2_OID = bytes.fromhex("06092a864886f70d01050d")

_LOGIN_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}


@dataclass(frozen=True, repr=False)
class Material:
    """What a ``security`` section names, read: the SASL password and the PEM texts (no repr: secrets)."""

    password: str | None = None
    ca_pem: str | None = None
    cert_pem: str | None = None
    key_pem: str | None = None
    key_password: str | None = None


def _read(path: Path, field: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        msg = f"security.{field}: cannot read {path}: {reason}"
        raise ConfigError(msg) from None


def _secret(path: Path, field: str) -> str:
    """A password file's text without its trailing newline (``echo pw > file`` and Kubernetes both work)."""
    text = _read(path, field).rstrip("\r\n")
    if not text:
        msg = f"security.{field}: {path} is empty"
        raise ConfigError(msg)
    return text


def _pem(path: Path, field: str, kind: str) -> str:
    text = _read(path, field)
    if "-----BEGIN " not in text:
        msg = f"security.{field}: {path} holds no PEM block (expected {kind})"
        raise ConfigError(msg)
    return text


def read_material(security: KafkaSecurity) -> Material:
    """Read the files (and the password's environment variable) ``security`` names.

    A ConfigError names the field and the file that could not be read, never a secret.
    """
    password = None
    if security.password_file is not None:
        password = _secret(security.password_file, "password_file")
    elif security.password_env is not None:
        password = os.environ.get(security.password_env)
        if not password:
            msg = f"security.password_env: the environment variable {security.password_env} is not set"
            raise ConfigError(msg)
    key_pem = None
    if security.client_key_file is not None:
        key_pem = _pem(security.client_key_file, "client_key_file", "a private key")
    return Material(
        password=password,
        ca_pem=None if security.ca_file is None else _pem(security.ca_file, "ca_file", "certificates"),
        cert_pem=(None if security.client_cert_file is None
                  else _pem(security.client_cert_file, "client_cert_file", "a certificate")),
        key_pem=key_pem,
        key_password=(None if security.key_password_file is None
                      else _secret(security.key_password_file, "key_password_file")),
    )


def librdkafka_security(security: KafkaSecurity, material: Material) -> dict[str, str]:
    """``security`` as librdkafka options (empty for PLAINTEXT)."""
    if security.protocol == "PLAINTEXT":
        return {}
    out: dict[str, str] = {"security.protocol": security.protocol}
    if security.protocol.startswith("SASL_"):
        assert security.mechanism and security.username and material.password  # noqa: S101 - validated
        out |= {"sasl.mechanism": security.mechanism, "sasl.username": security.username,
                "sasl.password": material.password}
    if security.protocol.endswith("SSL"):
        out["ssl.endpoint.identification.algorithm"] = "https" if security.check_hostname else "none"
        if material.ca_pem is not None:
            out["ssl.ca.pem"] = material.ca_pem
        if material.cert_pem is not None and material.key_pem is not None:
            out |= {"ssl.certificate.pem": material.cert_pem, "ssl.key.pem": material.key_pem}
        if material.key_password is not None:
            out["ssl.key.password"] = material.key_password
    return out


def _jaas_quoted(text: str) -> str:
    """A JAAS option value in double quotes (Kafka's parser takes backslash escapes inside them)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def java_security(security: KafkaSecurity, material: Material) -> dict[str, str]:
    """``security`` as Java client options, without the ``kafka.`` prefix (empty for PLAINTEXT).

    The Java client's PEM keystore takes a PKCS#8 key only (``BEGIN PRIVATE KEY`` or ``BEGIN ENCRYPTED
    PRIVATE KEY``); an RSA or EC key in its traditional form is refused here with the command that
    converts it.
    """
    if security.protocol == "PLAINTEXT":
        return {}
    out: dict[str, str] = {"security.protocol": security.protocol}
    if security.protocol.startswith("SASL_"):
        assert security.mechanism and security.username and material.password  # noqa: S101 - validated
        out["sasl.mechanism"] = security.mechanism
        out["sasl.jaas.config"] = (f"{_LOGIN_MODULES[security.mechanism]} required "
                                   f"username={_jaas_quoted(security.username)} "
                                   f"password={_jaas_quoted(material.password)};")
    if security.protocol.endswith("SSL"):
        out["ssl.endpoint.identification.algorithm"] = "https" if security.check_hostname else ""
        if material.ca_pem is not None:
            out |= {"ssl.truststore.type": "PEM", "ssl.truststore.certificates": material.ca_pem}
        if material.cert_pem is not None and material.key_pem is not None:
            if _pbes2(material.key_pem):
                msg = (f"security.client_key_file: {security.client_key_file} is encrypted with PBES2, "
                       "which Spark's Kafka client (the JDK) cannot read: convert it with openssl pkcs8 "
                       "-topk8 -v1 PBE-SHA1-3DES (or -nocrypt, without key_password_file)")
                raise ConfigError(msg)
            if "-----BEGIN PRIVATE KEY-----" not in material.key_pem and \
                    "-----BEGIN ENCRYPTED PRIVATE KEY-----" not in material.key_pem:
                msg = (f"security.client_key_file: {security.client_key_file} is not a PKCS#8 key, which "
                       "Spark's Kafka client needs (convert it: openssl pkcs8 -topk8 -in KEY -out KEY8 "
                       "-nocrypt; encrypted, -v1 PBE-SHA1-3DES with key_password_file: the JDK reads no "
                       "PBES2 key)")
                raise ConfigError(msg)
            out |= {"ssl.keystore.type": "PEM", "ssl.keystore.certificate.chain": material.cert_pem,
                    "ssl.keystore.key": material.key_pem}
            if material.key_password is not None:
                out["ssl.key.password"] = material.key_password
    return out


def _pbes2(key_pem: str) -> bool:
    """Whether the PEM's encrypted PKCS#8 key names PBES2 (its DER holds the object identifier)."""
    import base64
    import binascii
    import re

    block = re.search(r"-----BEGIN ENCRYPTED PRIVATE KEY-----(.*?)-----END", key_pem, flags=re.S)
    if block is None:
        return False
    try:
        der = base64.b64decode("".join(block.group(1).split()))
    except (binascii.Error, ValueError):
        return False
    return _PBES2_OID in der[:64]


def librdkafka_options(source: SourceConfig) -> dict[str, str]:
    """The source's ``kafka`` options and its ``security``, for a librdkafka client."""
    return {**source.kafka, **librdkafka_security(source.security, read_material(source.security))}


def java_options(source: SourceConfig) -> dict[str, str]:
    """The source's ``kafka`` options and its ``security``, for Spark's Java client (no ``kafka.`` prefix)."""
    return {**source.kafka, **java_security(source.security, read_material(source.security))}


def tls_diagnosis(bootstrap: str, options: Mapping[str, Any], timeout_s: float = 5.0) -> str | None:
    """Why the first broker's certificate fails verification, as Python's TLS says it, or None.

    librdkafka says "certificate verify failed" alike for an untrusted CA, an expired certificate and a
    certificate that names another host; one handshake with the client's own CA and hostname check
    (``ssl.ca.pem`` or ``ssl.ca.location``, ``ssl.endpoint.identification.algorithm`` of ``options``)
    names which.
    """
    import socket
    import ssl

    host, _, port = bootstrap.split(",")[0].strip().rpartition(":")
    host = host.strip("[]")
    try:
        context = ssl.create_default_context(cadata=options.get("ssl.ca.pem") or None,
                                             cafile=options.get("ssl.ca.location") or None)
    except (OSError, ssl.SSLError):
        return None
    context.check_hostname = options.get("ssl.endpoint.identification.algorithm", "https") == "https"
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s) as raw, \
                context.wrap_socket(raw, server_hostname=host):
            return None
    except ssl.SSLCertVerificationError as exc:
        detail = exc.verify_message or str(exc)
        if "hostname mismatch" in detail.lower() or "ip address mismatch" in detail.lower():
            return (f"TLS: the broker's certificate does not name {host} ({detail}; bootstrap_servers, "
                    "security.check_hostname)")
        if "expired" in detail.lower():
            return f"TLS: the broker's certificate has expired ({detail})"
        return f"TLS: the broker's certificate is not trusted ({detail}; security.ca_file)"
    except (OSError, ValueError):
        return None


#: What a Kafka client's error means for a user, by pieces of its text in either client's words (librdkafka's
#: error callback, Spark's Java client's exceptions): the cause and what to check. First match wins.
_CAUSES: tuple[tuple[tuple[str, ...], str], ...] = (
    (("authentication failed", "sasl authentication error", "saslauthenticationexception"),
     "authentication failed: the broker refused the SASL user or password (security.username, "
     "security.password_file)"),
    (("not authorized", "authorizationexception", "authorization_failed"),
     "not authorized: the source's principal needs Describe and Read on its topics and Read on the "
     "consumer groups named source-backfill-*"),
    (("hostname",), "TLS: the broker's certificate does not name the host connected to (bootstrap_servers; "
                    "security.check_hostname)"),
    (("certificate verify failed",), "TLS: the broker's certificate is not trusted (security.ca_file: the CA "
                                     "that signed it) or has expired"),
    (("certificate required",), "TLS: the broker requires a client certificate (security.client_cert_file "
                                "and client_key_file)"),
    (("handshake failed",), "TLS: the handshake with the broker failed (security.protocol, "
                            "security.ca_file)"),
    (("disconnected while requesting apiversion",), "the broker closed the connection at once: does "
                                                     "security.protocol match its listener?"),
)


def cause_of(text: str) -> str | None:
    """The cause a Kafka client's error text names, said for a user (None: none this knows)."""
    low = text.lower()
    return next((cause for pieces, cause in _CAUSES if any(p in low for p in pieces)), None)


def explain_failure(text: str, bootstrap: str, options: Mapping[str, Any]) -> str:
    """``text`` (a Kafka client's error, either client's) followed by its cause and what to check.

    A TLS failure is checked once more with Python's TLS (:func:`tls_diagnosis`), which tells an untrusted
    CA from a certificate naming another host; neither client names which.
    """
    cause = cause_of(text)
    low = text.lower()
    if (cause or "").startswith("TLS") or (cause is None and ("ssl" in low or "certificate" in low)):
        cause = tls_diagnosis(bootstrap, options) or cause
    return text if cause is None else f"{text}; {cause}"
