"""TLS material for the embedded broker's secured mode: a private CA and the certificates it signs.

Made with ``openssl`` subprocesses (``/usr/bin/openssl``, 1.1.1 or 3.x): the project takes no Python
crypto dependency for a test fixture. Everything is PEM, so the broker (Kafka's PEM key store, KIP-651:
``ssl.keystore.type=PEM``) and the clients (librdkafka's ``ssl.*.location``, the JVM's PEM stores) read
the same files.

Kafka loads a PEM key store *file* only with an encrypted key (``ssl.key.password`` is mandatory there)
and decrypts it with the JDK's ``SecretKeyFactory`` named by the key's algorithm, which knows the PKCS#12
PBE schemes but not PBES2; so every key is written as PKCS#8 encrypted with ``PBE-SHA1-3DES`` (OpenSSL's
default provider still has it, and librdkafka decrypts it too). The keys are EC P-256: a key costs a few
milliseconds on a busy machine where an RSA one can cost a second.

Passwords never reach a command line: OpenSSL reads them from files (``-passin``/``-passout file:``).
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from source_backfill.errors import KafkaConnectorError

#: How long the material is valid: the fixture's life is a test session, a kept demo folder can be older.
VALID_DAYS = 3650


@dataclass(frozen=True)
class Issued:
    """One certificate and its key, as files."""

    cert_file: Path
    key_file: Path  # PKCS#8, encrypted with the password in ``key_password_file``
    key_password_file: Path
    #: the certificate followed by the key: what Kafka's ``ssl.keystore.type=PEM`` reads
    keystore_file: Path


@dataclass(frozen=True)
class CertificateAuthority:
    """A private CA: its certificate (what clients trust) and its key (what signs)."""

    cert_file: Path
    key_file: Path
    key_password_file: Path
    folder: Path

    def issue(self, name: str, common_name: str, sans: tuple[str, ...] = (), *,
              expired: bool = False) -> Issued:
        """A certificate for ``common_name`` signed by this CA, valid for TLS servers and clients.

        ``sans`` are ``DNS:host`` / ``IP:1.2.3.4`` entries of the subjectAltName; a certificate for a
        client needs none. The files are ``<name>.pem``, ``<name>.key`` and ``<name>.keystore.pem`` in the
        CA's folder; an existing set is kept (a kept broker folder restarts with its material).
        ``expired``: valid on 1 January 2020 only (what a client must refuse as expired).
        """
        cert, key = self.folder / f"{name}.pem", self.folder / f"{name}.key"
        keystore = self.folder / f"{name}.keystore.pem"
        if not (cert.exists() and key.exists() and keystore.exists()):
            plain = self.folder / f"{name}.plain.key"
            csr, ext = self.folder / f"{name}.csr", self.folder / f"{name}.ext"
            try:
                _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
                         "-out", str(plain))
                _openssl("req", "-new", "-key", str(plain), "-subj", f"/CN={common_name}", "-out", str(csr))
                lines = ["basicConstraints=critical,CA:FALSE",
                         "keyUsage=critical,digitalSignature,keyEncipherment",
                         "extendedKeyUsage=serverAuth,clientAuth"]
                if sans:
                    lines.append("subjectAltName=" + ",".join(sans))
                ext.write_text("\n".join(lines) + "\n")
                if expired:
                    self._sign_dated(csr, ext, cert, "20200101000000Z", "20200102000000Z")
                else:
                    _openssl("x509", "-req", "-in", str(csr), "-CA", str(self.cert_file),
                             "-CAkey", str(self.key_file), "-passin", f"file:{self.key_password_file}",
                             "-set_serial", str(_serial()),
                             "-days", str(VALID_DAYS), "-sha256", "-extfile", str(ext), "-out", str(cert))
                _encrypt_key(plain, key, self.key_password_file)
            finally:
                for tmp in (plain, csr, ext):
                    tmp.unlink(missing_ok=True)
            keystore.write_text(cert.read_text() + key.read_text())
            keystore.chmod(0o600)
        return Issued(cert, key, self.key_password_file, keystore)

    def _sign_dated(self, csr: Path, ext: Path, out: Path, not_before: str, not_after: str) -> None:
        """Sign ``csr`` valid from ``not_before`` to ``not_after`` (``YYYYMMDDHHMMSSZ``).

        ``openssl x509`` of OpenSSL 3.0 takes a number of days from now only; ``openssl ca`` takes dates,
        with a database (made here, thrown away after).
        """
        db = Path(tempfile.mkdtemp(prefix="ca-", dir=self.folder))
        try:
            (db / "index.txt").touch()
            (db / "serial").write_text(f"{_serial():016X}\n")
            config = db / "ca.cnf"
            config.write_text("\n".join([
                "[ca]", "default_ca = d", "[d]", f"database = {db / 'index.txt'}", f"new_certs_dir = {db}",
                f"serial = {db / 'serial'}", "default_md = sha256", "policy = p", "unique_subject = no",
                "[p]", "commonName = supplied", ""]))
            _openssl("ca", "-config", str(config), "-batch", "-notext", "-in", str(csr),
                     "-cert", str(self.cert_file), "-keyfile", str(self.key_file),
                     "-passin", f"file:{self.key_password_file}", "-startdate", not_before,
                     "-enddate", not_after, "-extfile", str(ext), "-out", str(out))
        finally:
            shutil.rmtree(db, ignore_errors=True)


def make_ca(folder: Path, name: str, common_name: str) -> CertificateAuthority:
    """A self-signed CA in ``folder`` (``<name>.pem``, ``<name>.key``, one key password file per folder).

    An existing CA there is reused, so certificates issued before stay valid.
    """
    folder.mkdir(parents=True, exist_ok=True)
    password = password_file(folder / "key.password")
    cert, key = folder / f"{name}.pem", folder / f"{name}.key"
    if not (cert.exists() and key.exists()):
        plain = folder / f"{name}.plain.key"
        try:
            _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", str(plain))
            _openssl("req", "-x509", "-new", "-key", str(plain), "-subj", f"/CN={common_name}",
                     "-days", str(VALID_DAYS), "-sha256", "-set_serial", str(_serial()),
                     "-addext", "basicConstraints=critical,CA:TRUE",
                     "-addext", "keyUsage=critical,keyCertSign,cRLSign", "-out", str(cert))
            _encrypt_key(plain, key, password)
        finally:
            plain.unlink(missing_ok=True)
    return CertificateAuthority(cert, key, password, folder)


def password_file(path: Path, nbytes: int = 18) -> Path:
    """``path`` holding a random password (URL-safe, no newline), made once and kept; mode 0600."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_urlsafe(nbytes))
    return path


def read_password(path: Path) -> str:
    """The password a :func:`password_file` holds (surrounding whitespace stripped)."""
    return path.read_text().strip()


def _encrypt_key(plain: Path, out: Path, password: Path) -> None:
    # PBE-SHA1-3DES: the PKCS#8 scheme the JDK's SecretKeyFactory can name (see the module's docstring)
    _openssl("pkcs8", "-topk8", "-v1", "PBE-SHA1-3DES", "-in", str(plain), "-out", str(out),
             "-passout", f"file:{password}")
    out.chmod(0o600)


def _serial() -> int:
    return secrets.randbits(63) | 1


def _openssl(*args: str) -> None:
    exe = shutil.which("openssl")
    if exe is None:
        msg = "openssl is not on PATH: the embedded broker's secured mode makes its certificates with it"
        raise KafkaConnectorError(msg)
    done = subprocess.run([exe, *args], capture_output=True, text=True, check=False, timeout=60)
    if done.returncode != 0:
        msg = f"openssl {args[0]} failed ({done.returncode}): {done.stderr.strip()[-1000:]}"
        raise KafkaConnectorError(msg)
