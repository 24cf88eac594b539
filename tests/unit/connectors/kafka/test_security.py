"""One ``security`` section, each Kafka client's spelling (``connectors/kafka/security.py``).

librdkafka refuses the Java client's options and the Java client ignores librdkafka's, so each client's
translation is checked against the names that client takes; secrets are read from files (a trailing
newline dropped) or an environment variable, and a missing one is named, never shown.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from connectors.kafka.security import (
    REDACTED_OPTIONS,
    java_options,
    java_security,
    librdkafka_options,
    librdkafka_security,
    read_material,
)
from source_backfill.config import KafkaSecurity, SourceConfig
from source_backfill.errors import ConfigError

CA = "-----BEGIN CERTIFICATE-----\nQ0E=\n-----END CERTIFICATE-----\n"
CERT = "-----BEGIN CERTIFICATE-----\nY2VydA==\n-----END CERTIFICATE-----\n"
KEY = "-----BEGIN PRIVATE KEY-----\na2V5\n-----END PRIVATE KEY-----\n"
CANARY = 'canary-pw-"quoted"\\-9f1'


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    out = {"password": tmp_path / "password", "ca": tmp_path / "ca.pem", "cert": tmp_path / "client.pem",
           "key": tmp_path / "client.key", "key_password": tmp_path / "key-password"}
    out["password"].write_text(CANARY + "\n")  # as `echo` writes it
    out["ca"].write_text(CA)
    out["cert"].write_text(CERT)
    out["key"].write_text(KEY)
    out["key_password"].write_text("kp")
    return out


def scram(files: dict[str, Path], **more: object) -> KafkaSecurity:
    return KafkaSecurity(protocol="SASL_SSL", mechanism="SCRAM-SHA-512", username="alice",
                         password_file=files["password"], ca_file=files["ca"], **more)  # type: ignore[arg-type]


def mtls(files: dict[str, Path], **more: object) -> KafkaSecurity:
    return KafkaSecurity(protocol="SSL", ca_file=files["ca"], client_cert_file=files["cert"],
                         client_key_file=files["key"], **more)  # type: ignore[arg-type]


def test_plaintext_adds_nothing_for_either_client() -> None:
    source = SourceConfig(name="s", topics=["t"], kafka={"client.id": "c"})
    assert librdkafka_options(source) == java_options(source) == {"client.id": "c"}


def test_scram_over_tls_with_a_private_ca_in_librdkafkas_spelling(files) -> None:
    security = scram(files)
    assert librdkafka_security(security, read_material(security)) == {
        "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "alice",
        "sasl.password": CANARY, "ssl.endpoint.identification.algorithm": "https", "ssl.ca.pem": CA,
    }


def test_scram_over_tls_with_a_private_ca_in_the_java_clients_spelling(files) -> None:
    security = scram(files)
    options = java_security(security, read_material(security))
    assert options == {
        "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.jaas.config": ('org.apache.kafka.common.security.scram.ScramLoginModule required '
                             'username="alice" password="canary-pw-\\"quoted\\"\\\\-9f1";'),
        "ssl.endpoint.identification.algorithm": "https", "ssl.truststore.type": "PEM",
        "ssl.truststore.certificates": CA,
    }


def test_plain_uses_the_plain_login_module(files) -> None:
    security = KafkaSecurity(protocol="SASL_PLAINTEXT", mechanism="PLAIN", username="u",
                             password_file=files["password"])
    java = java_security(security, read_material(security))
    assert java["sasl.jaas.config"].startswith("org.apache.kafka.common.security.plain.PlainLoginModule ")
    assert "ssl.truststore.type" not in java and "ssl.endpoint.identification.algorithm" not in java


def test_mtls_gives_each_client_its_certificate_and_key(files) -> None:
    security = mtls(files, key_password_file=files["key_password"], check_hostname=False)
    material = read_material(security)
    assert librdkafka_security(security, material) == {
        "security.protocol": "SSL", "ssl.endpoint.identification.algorithm": "none", "ssl.ca.pem": CA,
        "ssl.certificate.pem": CERT, "ssl.key.pem": KEY, "ssl.key.password": "kp",
    }
    assert java_security(security, material) == {
        "security.protocol": "SSL", "ssl.endpoint.identification.algorithm": "",
        "ssl.truststore.type": "PEM", "ssl.truststore.certificates": CA, "ssl.keystore.type": "PEM",
        "ssl.keystore.certificate.chain": CERT, "ssl.keystore.key": KEY, "ssl.key.password": "kp",
    }


def test_a_key_the_java_client_cannot_read_is_refused_with_the_command_that_converts_it(files) -> None:
    files["key"].write_text("-----BEGIN RSA PRIVATE KEY-----\nx\n-----END RSA PRIVATE KEY-----\n")
    security = mtls(files)
    assert librdkafka_security(security, read_material(security))["ssl.key.pem"].startswith("-----BEGIN RSA")
    with pytest.raises(ConfigError, match="PKCS#8.*openssl pkcs8 -topk8"):
        java_security(security, read_material(security))


def test_a_pbes2_encrypted_key_is_refused_for_the_java_client_saying_how_to_convert_it(files) -> None:
    """OpenSSL's default encryption of a PKCS#8 key (PBES2) is one the JDK's PEM key store cannot read."""
    import subprocess

    key = files["key"]
    made = subprocess.run(["openssl", "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
                           "-aes256", "-pass", "pass:kp", "-out", str(key)], capture_output=True, check=False)
    if made.returncode != 0:
        pytest.skip(f"openssl could not make a key: {made.stderr!r}")
    assert "ENCRYPTED PRIVATE KEY" in key.read_text()
    security = mtls(files, key_password_file=files["key_password"])
    with pytest.raises(ConfigError, match="PBES2.*PBE-SHA1-3DES"):
        java_security(security, read_material(security))
    v1 = subprocess.run(["openssl", "pkcs8", "-topk8", "-v1", "PBE-SHA1-3DES", "-passin", "pass:kp",
                         "-passout", "pass:kp", "-in", str(key), "-out", str(key) + ".v1"],
                        capture_output=True, check=False)
    if v1.returncode == 0:  # the converted key passes
        key.write_text(Path(str(key) + ".v1").read_text())
        assert "ssl.keystore.key" in java_security(security, read_material(security))


def test_the_password_from_an_environment_variable(files, monkeypatch) -> None:
    security = KafkaSecurity(protocol="SASL_SSL", mechanism="SCRAM-SHA-256", username="u",
                             password_env="KAFKA_PASSWORD")
    monkeypatch.setenv("KAFKA_PASSWORD", "from-env")
    assert librdkafka_security(security, read_material(security))["sasl.password"] == "from-env"
    monkeypatch.delenv("KAFKA_PASSWORD")
    with pytest.raises(ConfigError, match="KAFKA_PASSWORD is not set"):
        read_material(security)


@pytest.mark.parametrize(("which", "content", "says"), [
    ("password", None, "cannot read"), ("password", "\n", "is empty"), ("ca", "not a pem", "no PEM block"),
    ("cert", None, "cannot read"),
])
def test_a_secret_that_cannot_be_read_is_named_by_field_and_file(files, which, content, says) -> None:
    if content is None:
        files[which].unlink()
    else:
        files[which].write_text(content)
    security = KafkaSecurity(protocol="SASL_SSL", mechanism="SCRAM-SHA-512", username="alice",
                             password_file=files["password"], ca_file=files["ca"],
                             client_cert_file=files["cert"], client_key_file=files["key"])
    with pytest.raises(ConfigError) as err:
        read_material(security)
    assert says in str(err.value) and str(files[which]) in str(err.value)
    assert CANARY not in str(err.value)


@pytest.mark.parametrize(("fields", "says"), [
    ({"protocol": "SASL_SSL", "username": "u", "password_env": "P"}, "needs mechanism and username"),
    ({"protocol": "SASL_SSL", "mechanism": "PLAIN", "username": "u"}, "password_file or password_env"),
    ({"protocol": "SASL_SSL", "mechanism": "PLAIN", "username": "u", "password_env": "P",
      "password_file": "/p"}, "one of them"),
    ({"protocol": "SSL", "username": "u"}, "for SASL protocols"),
    ({"protocol": "SASL_PLAINTEXT", "mechanism": "PLAIN", "username": "u", "password_env": "P",
      "ca_file": "/ca"}, "for TLS protocols"),
    ({"protocol": "SSL", "client_cert_file": "/c"}, "go together"),
    ({"protocol": "SSL", "key_password_file": "/k"}, "password of client_key_file"),
    ({"protocol": "SASL_SSL", "mechanism": "OAUTHBEARER", "username": "u", "password_env": "P"}, "mechanism"),
    ({"protocol": "SASL_SSL", "mechanism": "PLAIN", "username": "u", "password_env": "P; rm -rf"}, "pattern"),
])
def test_an_incoherent_section_is_refused_saying_why(fields, says) -> None:
    with pytest.raises(ValidationError, match=says):
        KafkaSecurity(**fields)


@pytest.mark.parametrize("key", ["sasl.jaas.config", "kafka.sasl.password", "ssl.truststore.location",
                                 "ssl.ca.location", "SECURITY.PROTOCOL", "sasl.mechanisms"])
def test_a_security_option_in_kafka_is_refused_in_either_clients_spelling(key) -> None:
    with pytest.raises(ValidationError, match="security section"):
        SourceConfig(name="s", topics=["t"], kafka={key: "x"})


def test_the_options_that_carry_secrets_are_the_ones_spark_redacts(files) -> None:
    """Every option holding a secret or a private key matches the redaction regex Spark is given; the
    public ones (a CA, a certificate, the protocol) stay readable in a plan."""
    import re

    security = mtls(files, key_password_file=files["key_password"])
    material = read_material(security)
    sasl = scram(files)
    options = {**librdkafka_security(security, material), **java_security(security, material),
               **librdkafka_security(sasl, read_material(sasl)), **java_security(sasl, read_material(sasl))}
    redacted = {k for k in options if re.search(REDACTED_OPTIONS, f"kafka.{k}")}
    assert redacted == {"sasl.password", "sasl.jaas.config", "ssl.key.pem", "ssl.keystore.key",
                        "ssl.key.password"}


@pytest.mark.parametrize(("heard", "says"), [
    ('KafkaError{code=_AUTHENTICATION,val=-169,str="sasl_ssl://127.0.0.1:1/bootstrap: SASL authentication '
     'error: Authentication failed during authentication due to invalid credentials with SASL mechanism '
     'SCRAM-SHA-512 (after 317ms in state AUTH_REQ)"}', "authentication failed"),
    ('KafkaError{code=_TRANSPORT,val=-195,str="sasl_ssl://127.0.0.1:1/bootstrap: error:0A000086:SSL '
     'routines::certificate verify failed (after 20ms in state SSL_HANDSHAKE)"}', "not trusted"),
    ('KafkaError{code=_ALL_BROKERS_DOWN,val=-187,str="1/1 brokers are down"}', None),
])
def test_a_connection_error_the_client_heard_is_told_by_its_cause(heard, says) -> None:
    """librdkafka's calls say only "transport failure"; its error callback heard why (texts from the
    secured broker of tests/integration/kafka)."""
    from connectors.kafka.admin import connect_failure

    told = connect_failure(heard)
    if says is None:
        assert told is None
    else:
        assert told is not None and says in told and heard in told
