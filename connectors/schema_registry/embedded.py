"""An embedded Schema Registry: Apicurio Registry as a subprocess on loopback, in-memory storage.

Used by the tests (the ``schema_registry`` fixture) when no ``SCHEMA_REGISTRY_URL`` is configured. The
registry is built once by ``make registry`` (:mod:`connectors.schema_registry.app` finds it); it serves
Confluent's Schema Registry API at ``/apis/ccompat/v7``, which is :attr:`EmbeddedRegistry.url`, the
address a Confluent client (``SchemaRegistryClient({"url": ...})``) takes. Its schemas live in memory
(H2) and are gone when it stops.

As Confluent's registry does, it starts with the global compatibility level ``BACKWARD``
(``compatibility=None`` leaves Apicurio's own default, no check at all). One difference a test can meet:
an incompatible schema is refused with HTTP status 409 as Confluent's is, but its body's ``error_code``
is 0 where Confluent's is 409.

The registry runs in a process group of its own and is stopped with it; it also gets SIGTERM if the
Python process that started it dies (Linux ``PR_SET_PDEATHSIG``), so no stray ``java`` outlives a killed
test run. Its console log is ``registry.out`` in a temp folder removed at stop, or in ``log_dir`` when one
is given (then kept).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Literal

from connectors.child_process import ChildServer, die_with_parent, free_port, java
from source_backfill.errors import RegistryUnavailableError

logger = logging.getLogger(__name__)

#: The path of the Confluent-compatible API under the registry's root.
CCOMPAT_PATH = "/apis/ccompat/v7"
#: The JVM of a registry for tests: a small heap, C1 only (starts sooner on 2 cores), the serial collector
#: (fewer threads, a smaller footprint).
_JVM_OPTS = ["-Xms64m", "-Xmx256m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Xshare:auto",
             "-Djava.awt.headless=true"]

Compatibility = Literal["BACKWARD", "BACKWARD_TRANSITIVE", "FORWARD", "FORWARD_TRANSITIVE", "FULL",
                        "FULL_TRANSITIVE", "NONE"]


def _java() -> str:
    return java("the embedded Schema Registry", RegistryUnavailableError)


class EmbeddedRegistry(ChildServer):
    """Apicurio Registry on a free 127.0.0.1 port, Confluent's API at :attr:`url`.

    >>> with EmbeddedRegistry() as registry:  # doctest: +SKIP
    ...     client = SchemaRegistryClient({"url": registry.url})
    """

    def __init__(self, port: int | None = None, log_dir: str | Path | None = None,
                 startup_timeout_s: float = 120.0, compatibility: Compatibility | None = "BACKWARD") -> None:
        self._port = port
        self._keep = log_dir is not None
        self._log_dir = Path(log_dir) if log_dir is not None else None
        self._startup_timeout_s = startup_timeout_s
        self._compatibility = compatibility
        self._proc: subprocess.Popen[bytes] | None = None
        self._out: Path | None = None
        #: the registry's root, ``http://127.0.0.1:<port>``
        self.root = ""
        #: the Confluent-compatible API: what a Confluent client's ``url`` takes
        self.url = ""
        #: seconds from the process start until the API answered (the last start)
        self.startup_s = 0.0

    @property
    def log_dir(self) -> Path | None:
        """The folder holding ``registry.out``, the registry's console log."""
        return self._log_dir

    # -- lifecycle ---------------------------------------------------------------------------------------
    def start(self) -> EmbeddedRegistry:
        """Start the registry and wait until its API answers (then set the global compatibility level)."""
        if self._proc is not None:
            return self
        from connectors.schema_registry.app import runner_jar

        jar = runner_jar()
        if self._log_dir is None:
            self._log_dir = Path(tempfile.mkdtemp(prefix="schema-registry-"))
        self._log_dir.mkdir(parents=True, exist_ok=True)
        port = self._port or free_port()
        self.root = f"http://127.0.0.1:{port}"
        self.url = self.root + CCOMPAT_PATH
        env = {**os.environ, "HTTP_PORT": str(port), "QUARKUS_HTTP_HOST": "127.0.0.1"}
        self._out = self._log_dir / "registry.out"
        started = time.monotonic()
        with self._out.open("ab") as out:
            self._proc = subprocess.Popen(  # noqa: S603
                [_java(), *_JVM_OPTS, "-jar", str(jar)],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                cwd=self._log_dir,  # Quarkus may write files (tmp/) into its working folder
                preexec_fn=die_with_parent,  # noqa: PLW1509 - setsid + parent-death signal
            )
        try:
            self._wait_ready()
            self.startup_s = time.monotonic() - started
            if self._compatibility is not None:
                self._set_compatibility(self._compatibility)
        except BaseException:
            self.stop()
            raise
        logger.info('schema registry started url="%s" pid="%s" seconds="%.1f"', self.url, self._proc.pid,
                    self.startup_s)
        return self

    def _request(self, method: str, path: str, body: object = None, timeout_s: float = 10.0) -> object:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method,  # noqa: S310 - our loopback
                                     headers={"Content-Type": "application/vnd.schemaregistry.v1+json"})
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310
            return json.loads(resp.read() or b"null")

    def _set_compatibility(self, level: Compatibility) -> None:
        try:
            self._request("PUT", "/config", {"compatibility": level})
        except (urllib.error.URLError, OSError, ValueError) as exc:
            msg = f"the Schema Registry at {self.url} refused the global compatibility {level}: {exc}"
            raise RegistryUnavailableError(msg) from exc

    def _wait_ready(self) -> None:
        """Wait until ``GET /subjects`` answers 200 (API and storage up); fail if the process exits first."""
        deadline = time.monotonic() + self._startup_timeout_s
        last_error: object = None
        while time.monotonic() < deadline:
            assert self._proc is not None
            if self._proc.poll() is not None:
                msg = (f"the Schema Registry exited with code {self._proc.returncode} during startup; "
                       f"log: {self.log_tail()}")
                raise RegistryUnavailableError(msg)
            try:
                self._request("GET", "/subjects", timeout_s=2.0)
                return
            except (urllib.error.URLError, OSError, ValueError) as exc:  # not listening, 5xx, half an answer
                last_error = exc
            time.sleep(0.2)
        msg = (f"the Schema Registry at {self.url} did not answer within {self._startup_timeout_s}s "
               f"({last_error}); log: {self.log_tail()}")
        raise RegistryUnavailableError(msg)

    def _stopped(self) -> None:
        logger.info('schema registry stopped url="%s"', self.url)
