"""The embedded broker's secured modes: ``SASL_SSL`` with SCRAM users, or ``SSL`` with client certificates.

What :class:`connectors.kafka.embedded.EmbeddedBroker` needs to run a secured listener and what a client
needs to reach it, kept apart from the broker's process handling:

* a private CA and a broker certificate naming ``localhost`` and ``127.0.0.1`` (and a second broker
  certificate naming only ``wrong.example``, on a listener of its own, for hostname-verification tests),
  plus a second, *untrusted* CA's certificate; all PEM (:mod:`connectors.kafka.tls_material`);
* ``SASL_SSL``: SCRAM-SHA-512 and SCRAM-SHA-256 credentials of the admin and the named users, created
  when the log folder is formatted (``kafka-storage format --add-scram``): a KRaft cluster keeps them in
  its metadata log, so they exist before the first client connects;
* ``SSL``: ``ssl.client.auth=required``, a client certificate per user (``CN=<user>``) signed by the same
  CA; ``ssl.principal.mapping.rules`` maps ``CN=alice`` to ``alice``, so a principal is ``User:alice`` in
  both modes and ACL helpers need not care which;
* ``acls``: ``StandardAuthorizer``, ``allow.everyone.if.no.acl.found=false``, the admin a super user.

The controller listener stays ``PLAINTEXT`` on loopback: the broker half of the node registers with its
own controller half there, and with an authorizer on, that listener's ``User:ANONYMOUS`` must be a super
user (the controller authorizes the registration as a cluster action). It is not advertised to clients;
only a process on this host that knows the port can reach it. Inter-broker traffic (none on one node, but
Kafka requires a listener for it) uses the secured client listener with the admin's credentials (``SSL``:
the broker's own certificate, ``User:broker``).

Secrets are files (mode 0600): SCRAM passwords, the key password. They reach the broker through its
properties file; only the short-lived format step sees the SCRAM passwords on its command line.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from connectors.kafka import tls_material
from connectors.kafka.tls_material import CertificateAuthority, Issued

Protocol = Literal["SASL_SSL", "SSL"]
PROTOCOLS: tuple[Protocol, ...] = ("SASL_SSL", "SSL")
#: The user the fixture itself connects as (readiness, topic and ACL helpers): a super user when ACLs are on.
ADMIN = "admin"
MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256")
#: The SAN of the certificate on the hostname-mismatch listener: a name no client dials.
WRONG_HOST = "wrong.example"
#: The broker's own certificate: its subject is its principal on an ``SSL`` inter-broker listener.
BROKER_CN = "broker"

_SCRAM_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"
# CN=alice -> alice; anything else (an unusual subject) keeps its full distinguished name
_PRINCIPAL_RULES = "RULE:^CN=([^,]+)$/$1/,DEFAULT"


class BrokerSecurity:
    """The TLS material, users and settings of one secured embedded broker, in ``folder``.

    Made once per folder: a kept broker folder restarts with its CA, certificates and passwords.
    """

    def __init__(self, folder: Path, protocol: Protocol, acls: bool, users: Iterable[str]) -> None:
        if protocol not in PROTOCOLS:
            msg = f"security must be one of {PROTOCOLS} (or PLAINTEXT), not {protocol!r}"
            raise ValueError(msg)
        self.folder = folder
        self.protocol: Protocol = protocol
        self.acls = acls
        self.users = [ADMIN, *(u for u in dict.fromkeys(users) if u != ADMIN)]
        self._ca: CertificateAuthority | None = None
        self._broker_cert: Issued | None = None
        self._mismatch_cert: Issued | None = None
        self.untrusted_ca_file = folder / "untrusted" / "ca.pem"

    # -- material ---------------------------------------------------------------------------------------
    def prepare(self) -> None:
        """Make (or find) the CAs, the broker's certificates and every user's password or certificate."""
        self._ca = tls_material.make_ca(self.folder / "tls", "ca", "source-backfill test CA")
        tls_material.make_ca(self.folder / "untrusted", "ca", "untrusted test CA")
        self._broker_cert = self._ca.issue("broker", BROKER_CN, ("DNS:localhost", "IP:127.0.0.1"))
        self._mismatch_cert = self._ca.issue("mismatch", WRONG_HOST, (f"DNS:{WRONG_HOST}",))
        for user in self.users:
            self.add_user(user)

    def add_user(self, user: str) -> None:
        """The user's secret: a password file (``SASL_SSL``) or a client certificate (``SSL``).

        A ``SASL_SSL`` user also needs SCRAM credentials in the cluster: the format step creates the ones
        named before start, :meth:`EmbeddedBroker.add_user` the later ones.
        """
        if not user or not user.replace("-", "").replace("_", "").isalnum():
            msg = f"a user name of letters, digits, '-' and '_' please, not {user!r}"
            raise ValueError(msg)
        if user not in self.users:
            self.users.append(user)
        if self.protocol == "SASL_SSL":
            tls_material.password_file(self.password_file(user))
        else:
            self.ca.issue(f"client-{user}", user)

    @property
    def ca(self) -> CertificateAuthority:
        """The private CA (after :meth:`prepare`)."""
        if self._ca is None:
            msg = "the broker's TLS material is made at start"
            raise RuntimeError(msg)
        return self._ca

    @property
    def ca_file(self) -> Path:
        """The private CA's certificate: what clients trust."""
        return self.ca.cert_file

    def password_file(self, user: str) -> Path:
        """The file holding ``user``'s SCRAM password."""
        return self.folder / "secrets" / f"{user}.password"

    def password(self, user: str) -> str:
        """``user``'s SCRAM password."""
        return tls_material.read_password(self.password_file(user))

    @staticmethod
    def principal(user: str) -> str:
        """``User:<user>``: the principal Kafka's authorizer sees for ``user`` in either mode."""
        return f"User:{user}"

    # -- the broker's side ------------------------------------------------------------------------------
    def broker_properties(self, port: int, mismatch_port: int, cport: int) -> dict[str, str]:
        """Listeners and security settings of ``server.properties`` (they replace the plain ones)."""
        assert self._broker_cert is not None and self._mismatch_cert is not None
        p = self.protocol
        conf = {
            "listeners": f"CLIENT://127.0.0.1:{port},MISMATCH://127.0.0.1:{mismatch_port},"
                         f"CONTROLLER://127.0.0.1:{cport}",
            "advertised.listeners": f"CLIENT://127.0.0.1:{port},MISMATCH://127.0.0.1:{mismatch_port}",
            "listener.security.protocol.map": f"CLIENT:{p},MISMATCH:{p},CONTROLLER:PLAINTEXT",
            "inter.broker.listener.name": "CLIENT",
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(self._broker_cert.keystore_file),
            "ssl.key.password": tls_material.read_password(self._broker_cert.key_password_file),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.ca_file),
            "ssl.client.auth": "required" if p == "SSL" else "none",
            "ssl.principal.mapping.rules": _PRINCIPAL_RULES,
        }
        for key in ("ssl.keystore.type", "ssl.keystore.location", "ssl.key.password"):
            conf[f"listener.name.mismatch.{key}"] = conf[key]
        conf["listener.name.mismatch.ssl.keystore.location"] = str(self._mismatch_cert.keystore_file)
        if p == "SASL_SSL":
            conf["sasl.enabled.mechanisms"] = ",".join(MECHANISMS)
            conf["sasl.mechanism.inter.broker.protocol"] = MECHANISMS[0]
            admin = f'{_SCRAM_MODULE} required username="{ADMIN}" password="{self.password(ADMIN)}";'
            for mechanism in MECHANISMS:
                # a SASL listener needs a login context per mechanism; the inter-broker one logs in as admin
                conf[f"listener.name.client.{mechanism.lower()}.sasl.jaas.config"] = admin
                conf[f"listener.name.mismatch.{mechanism.lower()}.sasl.jaas.config"] = (
                    f"{_SCRAM_MODULE} required;")
        if self.acls:
            conf["authorizer.class.name"] = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
            conf["allow.everyone.if.no.acl.found"] = "false"
            supers = [ADMIN, "ANONYMOUS"] + ([BROKER_CN] if p == "SSL" else [])
            conf["super.users"] = ";".join(self.principal(u) for u in supers)
        return conf

    def format_args(self) -> list[str]:
        """``kafka-storage format`` arguments creating the users' SCRAM credentials (``SASL_SSL``)."""
        if self.protocol != "SASL_SSL":
            return []
        return [arg for user in self.users for mechanism in MECHANISMS
                for arg in ("--add-scram", f"{mechanism}=[name={user},password={self.password(user)}]")]

    # -- the client's side ------------------------------------------------------------------------------
    def client_security(self, user: str, mechanism: str = MECHANISMS[0]) -> dict[str, str]:
        """What a client needs to connect as ``user``, as the daemon's ``security`` section names it.

        ``SASL_SSL``: ``protocol``, ``mechanism``, ``username``, ``password_file``, ``ca_file``;
        ``SSL``: ``protocol``, ``ca_file``, ``client_cert_file``, ``client_key_file``,
        ``key_password_file`` (the key is encrypted). Paths are absolute.
        """
        self._known(user)
        out = {"protocol": self.protocol, "ca_file": str(self.ca_file.resolve())}
        if self.protocol == "SASL_SSL":
            if mechanism not in MECHANISMS:
                msg = f"mechanism must be one of {MECHANISMS}, not {mechanism!r}"
                raise ValueError(msg)
            out.update(mechanism=mechanism, username=user,
                       password_file=str(self.password_file(user).resolve()))
        else:
            cert = self.ca.issue(f"client-{user}", user)
            out.update(client_cert_file=str(cert.cert_file.resolve()),
                       client_key_file=str(cert.key_file.resolve()),
                       key_password_file=str(cert.key_password_file.resolve()))
        return out

    def librdkafka_config(self, user: str, bootstrap: str, mechanism: str = MECHANISMS[0]) -> dict[str, str]:
        """A confluent-kafka (librdkafka) configuration connecting as ``user`` to ``bootstrap``."""
        sec = self.client_security(user, mechanism)
        conf = {"bootstrap.servers": bootstrap, "security.protocol": sec["protocol"],
                "ssl.ca.location": sec["ca_file"]}
        if self.protocol == "SASL_SSL":
            conf.update({"sasl.mechanism": sec["mechanism"], "sasl.username": user,
                         "sasl.password": self.password(user)})
        else:
            conf.update({"ssl.certificate.location": sec["client_cert_file"],
                         "ssl.key.location": sec["client_key_file"],
                         "ssl.key.password": tls_material.read_password(Path(sec["key_password_file"]))})
        return conf

    def _known(self, user: str) -> None:
        if user not in self.users:
            msg = f"no user {user!r} on this broker (users: {', '.join(self.users)}); add_user() makes one"
            raise KeyError(msg)


# -- admin requests (confluent-kafka) ---------------------------------------------------------------------
#: Operations :func:`grant` gives by default: what a consumer needs on its topic and its group.
READ_OPERATIONS = ("READ", "DESCRIBE")


def upsert_scram(admin_conf: dict[str, str], user: str, password: str, timeout_s: float) -> None:
    """Create or replace ``user``'s SCRAM-SHA-512 and -256 credentials (AlterUserScramCredentials)."""
    from confluent_kafka.admin import (  # type: ignore[attr-defined]
        AdminClient,
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialUpsertion,
    )

    admin: Any = AdminClient(dict(admin_conf))
    # one request per mechanism: the broker refuses a user altered twice in one request (DUPLICATE_RESOURCE)
    for mechanism in (ScramMechanism.SCRAM_SHA_512, ScramMechanism.SCRAM_SHA_256):
        upsert = UserScramCredentialUpsertion(user, ScramCredentialInfo(mechanism, 8192), password.encode())
        for future in admin.alter_user_scram_credentials([upsert], request_timeout=timeout_s).values():
            future.result(timeout=timeout_s)


def delete_scram(admin_conf: dict[str, str], user: str, timeout_s: float) -> None:
    """Delete ``user``'s SCRAM credentials (both mechanisms): its next authentication fails."""
    from confluent_kafka.admin import (  # type: ignore[attr-defined]
        AdminClient,
        ScramMechanism,
        UserScramCredentialDeletion,
    )

    admin: Any = AdminClient(dict(admin_conf))
    for mechanism in (ScramMechanism.SCRAM_SHA_512, ScramMechanism.SCRAM_SHA_256):
        deletion = UserScramCredentialDeletion(user, mechanism)
        for future in admin.alter_user_scram_credentials([deletion], request_timeout=timeout_s).values():
            future.result(timeout=timeout_s)


def wait_authenticates(conf: dict[str, str], timeout_s: float) -> None:
    """Return once a metadata request with ``conf`` answers.

    New credentials reach the broker's cache through the metadata log, a moment after the controller
    accepted them.
    """
    from confluent_kafka.admin import AdminClient

    admin: Any = AdminClient({**conf, "log_level": 0})
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        try:
            admin.list_topics(timeout=2)
            return
        except Exception as exc:  # noqa: BLE001 - an authentication failure means "not there yet"
            last = exc
        time.sleep(0.2)
    msg = f"{conf.get('sasl.username', 'the client')} could not connect within {timeout_s}s: {last}"
    raise TimeoutError(msg)


def grant(admin_conf: dict[str, str], principal: str, resources: list[tuple[str, str]],
          operations: Iterable[str], timeout_s: float) -> None:
    """ALLOW ``operations`` to ``principal`` on ``resources``, and wait until the broker applies them.

    ``resources`` are ``(type, name)``: ``TOPIC``, ``GROUP``, ``TRANSACTIONAL_ID`` or ``BROKER`` (the
    cluster, named ``kafka-cluster``); name ``*`` for all of a type. The wait reads DescribeAcls, which a
    KRaft broker answers from its own authorizer's cache: the ACLs its requests are checked against.
    """
    from confluent_kafka.admin import (  # type: ignore[attr-defined]
        AclBinding,
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        AdminClient,
        ResourcePatternType,
        ResourceType,
    )

    admin: Any = AdminClient(dict(admin_conf))
    bindings = [AclBinding(ResourceType[rtype], name, ResourcePatternType.LITERAL, principal, "*",
                           AclOperation[op], AclPermissionType.ALLOW)
                for rtype, name in resources for op in operations]
    for future in admin.create_acls(bindings, request_timeout=timeout_s).values():
        future.result(timeout=timeout_s)
    wanted = {(b.restype, b.name, b.operation) for b in bindings}
    deadline = time.monotonic() + timeout_s
    mine = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY,  # type: ignore[arg-type]
                            principal, None, AclOperation.ANY, AclPermissionType.ANY)  # type: ignore[arg-type]
    while True:
        found = admin.describe_acls(mine, request_timeout=timeout_s).result(timeout=timeout_s)
        missing = wanted - {(b.restype, b.name, b.operation) for b in found}
        if not missing:
            return
        if time.monotonic() > deadline:
            msg = f"ACLs of {principal} not applied by the broker after {timeout_s}s:"
            msg += f" {sorted(map(str, missing))}"
            raise TimeoutError(msg)
        time.sleep(0.2)
