"""A Cloud Storage API on loopback for tests: the real Google client libraries talk to it, nothing reaches the network.

Two layers read and write ``gs://`` in shardprep, and they are pointed at the local server differently:

* Beam's GCS IO (``apache_beam.io.gcp.gcsio``) uses ``google-cloud-storage``, which honours ``STORAGE_EMULATOR_HOST``.
  Beam always asks ``google.auth.default()`` for credentials first, and retries a failure with back-off for about
  30 s per process, so :data:`LoopbackStorage.environment` names a credentials file holding an access token that
  stays valid (never refreshed, so never sent to Google's token endpoint).
* TensorFlow's GCS file system (``tf.io.gfile``, ``tf.data``) has its endpoints compiled in
  (``https://www.googleapis.com/storage/v1/``, ``https://storage.googleapis.com/``) and no setting to change them.
  It does use libcurl, which honours ``https_proxy``, and TensorFlow passes ``CURL_CA_BUNDLE`` to libcurl. So an
  intercepting proxy on loopback accepts ``CONNECT www.googleapis.com:443``, answers TLS with a certificate from a
  throw-away CA named in ``CURL_CA_BUNDLE``, and hands the decrypted requests to the emulator. Its token comes from
  ``GOOGLE_AUTH_TOKEN_FOR_TESTING``.

The proxy forwards only the Cloud Storage hosts and refuses everything else, so it is also the guard that keeps any
other HTTPS request (a token refresh, a metadata lookup) from leaving the machine; plain HTTP to loopback bypasses it
(``no_proxy``), which is how the Beam layer and Beam's own loopback gRPC reach their servers.

The emulator (``gcp-storage-emulator``) runs as a child process with in-memory storage; :meth:`LoopbackStorage.stop`
ends it and the proxy.
"""

from __future__ import annotations

import datetime
import json
import socket
import socketserver
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

# Hosts TensorFlow's GCS file system talks to; the proxy sends their requests to the emulator.
INTERCEPTED_HOSTS = frozenset({"www.googleapis.com", "storage.googleapis.com"})
STARTUP_TIMEOUT_S = 30
_MAX_HEAD_BYTES = 64 * 1024


# ``shardprep ARGV`` for each (ARGV, working folder or None: the child's own) of the list ``commands``, in turn, in
# one process, each with its own click context: it prints, per command line, its exit status and what it wrote to
# stdout and stderr, as JSON on its last stdout line. Importing TensorFlow and Beam is most of a small command's
# cost; commands run against the server this way pay it once. A script that does more first puts its own lines,
# ending with ``commands = ...``, before COMMANDS_IN_TURN.
COMMANDS_IN_TURN = """
import contextlib, io, json, os
from shardprep.cli import main
results, home = [], os.getcwd()
for argv, working_folder in commands:
    os.chdir(working_folder or home)
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            main(argv, prog_name="shardprep")
            status = 0
        except SystemExit as exit:
            status = exit.code
    results.append({"argv": argv, "exit": status, "stdout": stdout.getvalue(), "stderr": stderr.getvalue()})
print(json.dumps(results))
"""
SHARDPREP_IN_TURN = "import json, sys\ncommands = json.loads(sys.argv[1])\n" + COMMANDS_IN_TURN


def shardprep_in_turn(command_lines: list[list[str]]) -> list[str]:
    """The child process's argv that runs each of ``command_lines`` in turn, in its own folder (SHARDPREP_IN_TURN)."""
    return [sys.executable, "-c", SHARDPREP_IN_TURN, json.dumps([[argv, None] for argv in command_lines])]


def in_turn_results(stdout: str, command_lines: list[list[str]]) -> list[dict]:
    """{"argv", "exit", "stdout", "stderr"} of each command line, from a ``shardprep_in_turn`` process's stdout."""
    results = json.loads(stdout.splitlines()[-1])
    assert [result["argv"] for result in results] == command_lines, results
    return results


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_test_certificates(directory: Path) -> tuple[Path, Path, Path]:
    """(CA certificate, server certificate, server key) PEM files; the server certificate names INTERCEPTED_HOSTS."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    valid_from, valid_to = now - datetime.timedelta(days=1), now + datetime.timedelta(days=2)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "shardprep test CA")])
    ca_cert = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
               .serial_number(x509.random_serial_number()).not_valid_before(valid_from).not_valid_after(valid_to)
               .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                            content_commitment=False, key_encipherment=False, data_encipherment=False,
                                            key_agreement=False, encipher_only=False, decipher_only=False),
                              critical=True)
               .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
               .sign(ca_key, hashes.SHA256()))

    server_key = ec.generate_private_key(ec.SECP256R1())
    server_cert = (x509.CertificateBuilder()
                   .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "www.googleapis.com")]))
                   .issuer_name(ca_name).public_key(server_key.public_key())
                   .serial_number(x509.random_serial_number()).not_valid_before(valid_from).not_valid_after(valid_to)
                   .add_extension(x509.SubjectAlternativeName([x509.DNSName(h) for h in sorted(INTERCEPTED_HOSTS)]),
                                  critical=False)
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
                   .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                                  critical=False)
                   .sign(ca_key, hashes.SHA256()))

    directory.mkdir(parents=True, exist_ok=True)
    ca_path, cert_path, key_path = directory / "ca.pem", directory / "server.pem", directory / "server-key.pem"
    ca_path.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    cert_path.write_bytes(server_cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(server_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                  serialization.NoEncryption()))
    return ca_path, cert_path, key_path


class _ProxyHandler(socketserver.BaseRequestHandler):
    """One client connection: CONNECT to a Cloud Storage host (TLS intercepted) or an absolute-form HTTP request.

    Requests are relayed one at a time: the emulator speaks HTTP/1.0 and closes after each response, so the
    relayed response ends the client's connection too, and the client opens a new one for its next request.
    """

    server: "_InterceptingProxy"

    def handle(self):
        connection = self.request
        connection.settimeout(60)
        try:
            method, target, head, rest = _read_head(connection)
        except (OSError, ValueError):
            return
        if method == "CONNECT":
            host = target.rsplit(":", 1)[0]
            if host not in INTERCEPTED_HOSTS:
                self.server.refused.append(target)
                connection.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
                return
            connection.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            try:
                connection = self.server.tls_context.wrap_socket(connection, server_side=True)
                method, target, head, rest = _read_head(connection)
            except (OSError, ValueError, ssl.SSLError):
                return
        else:
            # Absolute form, e.g. the resumable-upload URL the emulator built from the Host header.
            url = urlsplit(target)
            if url.hostname not in INTERCEPTED_HOSTS:
                self.server.refused.append(target)
                connection.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
                return
            origin_form = url.path + (f"?{url.query}" if url.query else "")
            head = head.replace(target.encode("latin-1"), origin_form.encode("latin-1"), 1)
        self.server.forwarded += 1
        try:
            self._relay(connection, head, rest)
        except (OSError, ValueError):
            pass  # the client went away; it sees the error on its side

    def _relay(self, connection, head: bytes, rest: bytes):
        reader = _Reader(connection, rest)
        lines = head[:-4].split(b"\r\n")
        headers = {name.strip().lower(): value.strip() for name, _, value in (line.partition(b":") for line in lines[1:])}
        if headers.get(b"expect", b"").lower() == b"100-continue":
            # libcurl waits a second for this before sending a large body; the emulator (HTTP/1.0) never sends it.
            connection.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
            lines = [line for line in lines if line.partition(b":")[0].strip().lower() != b"expect"]
            head = b"\r\n".join(lines) + b"\r\n\r\n"
        if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
            # TensorFlow streams uploads in chunks; the emulator reads Content-Length bodies only.
            body = reader.read_chunked()
            kept = [line for line in lines[1:]
                    if line.partition(b":")[0].strip().lower() not in (b"transfer-encoding", b"content-length")]
            head = b"\r\n".join([lines[0], *kept, b"Content-Length: %d" % len(body)]) + b"\r\n\r\n"
        else:
            body = reader.read_exactly(int(headers.get(b"content-length", b"0")))
        with socket.create_connection(("127.0.0.1", self.server.emulator_port), timeout=60) as upstream:
            upstream.sendall(head + body)
            while True:
                chunk = upstream.recv(1 << 20)
                if not chunk:
                    break
                connection.sendall(chunk)
        try:
            connection.close()
        except OSError:
            pass


class _Reader:
    """Reads a request body from a socket, starting with the bytes already read past the head."""

    def __init__(self, connection, buffered: bytes):
        self.connection, self.buffer = connection, buffered

    def _fill(self, size: int) -> None:
        while len(self.buffer) < size:
            chunk = self.connection.recv(1 << 20)
            if not chunk:
                raise ValueError("connection closed inside a request body")
            self.buffer += chunk

    def read_exactly(self, size: int) -> bytes:
        self._fill(size)
        data, self.buffer = self.buffer[:size], self.buffer[size:]
        return data

    def read_line(self) -> bytes:
        while b"\r\n" not in self.buffer:
            self._fill(len(self.buffer) + 1)
        line, self.buffer = self.buffer.split(b"\r\n", 1)
        return line

    def read_chunked(self) -> bytes:
        body = b""
        while True:
            size = int(self.read_line().split(b";")[0], 16)
            if size == 0:
                while self.read_line():  # trailers, up to the blank line
                    pass
                return body
            body += self.read_exactly(size)
            self.read_exactly(2)  # CRLF after the chunk


def _read_head(connection) -> tuple[str, str, bytes, bytes]:
    """(method, target, request line and headers up to the blank line, bytes read past them)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = connection.recv(65536)
        if not chunk:
            raise ValueError("connection closed before a request")
        data += chunk
        if len(data) > _MAX_HEAD_BYTES:
            raise ValueError("request head too long")
    head, rest = data.split(b"\r\n\r\n", 1)
    method, target, _ = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ", 2)
    return method, target, head + b"\r\n\r\n", rest


class _InterceptingProxy(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, emulator_port: int, cert_path: Path, key_path: Path):
        super().__init__(("127.0.0.1", 0), _ProxyHandler)
        self.emulator_port = emulator_port
        self.tls_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.tls_context.load_cert_chain(cert_path, key_path)
        self.forwarded = 0  # requests relayed to the emulator
        self.refused: list[str] = []  # targets that would have left the machine


class LoopbackStorage:
    """gcp-storage-emulator on 127.0.0.1 with one bucket, plus the proxy that lets TensorFlow reach it.

    ``with LoopbackStorage(workdir) as storage:`` starts both; run code that reads ``gs://`` with
    ``storage.environment`` added to its environment (child processes: pass it as ``env``).
    """

    def __init__(self, workdir: Path, bucket: str = "shardprep-test"):
        self.workdir, self.bucket = Path(workdir), bucket
        self.port = 0
        self._emulator: subprocess.Popen | None = None
        self._proxy: _InterceptingProxy | None = None
        self._proxy_thread: threading.Thread | None = None
        self.environment: dict[str, str] = {}

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def proxy(self) -> _InterceptingProxy:
        assert self._proxy is not None, "not started"
        return self._proxy

    def start(self) -> "LoopbackStorage":
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = _free_port()
        with open(self.workdir / "emulator.log", "wb") as log:
            self._emulator = subprocess.Popen(
                [sys.executable, "-m", "gcp_storage_emulator", "start", "--host", "127.0.0.1", "--port",
                 str(self.port), "--in-memory", "--default-bucket", self.bucket, "--quiet"],
                stdout=subprocess.DEVNULL, stderr=log, cwd=self.workdir)
        try:
            self._wait_until_serving()
            ca_path, cert_path, key_path = write_test_certificates(self.workdir / "tls")
            self._proxy = _InterceptingProxy(self.port, cert_path, key_path)
            self._proxy_thread = threading.Thread(target=self._proxy.serve_forever, daemon=True)
            self._proxy_thread.start()
            self.environment = self._make_environment(ca_path)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_until_serving(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            if self._emulator.poll() is not None:
                log = (self.workdir / "emulator.log").read_text(errors="replace")
                raise RuntimeError(f"gcp-storage-emulator exited with {self._emulator.returncode}: {log[-2000:]}")
            try:
                with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(
                        self.endpoint + "/", timeout=2) as response:
                    if response.read() == b"OK":
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"gcp-storage-emulator did not answer on {self.endpoint} "
                                   f"within {STARTUP_TIMEOUT_S} s")
            time.sleep(0.1)

    def _make_environment(self, ca_path: Path) -> dict[str, str]:
        # An access token that never expires: google.auth.default() finds it at once and the client never
        # refreshes it (a refresh would go to oauth2.googleapis.com, which the proxy refuses).
        credentials_path = self.workdir / "credentials.json"
        credentials_path.write_text(json.dumps({
            "type": "authorized_user", "client_id": "shardprep-test", "client_secret": "unused",
            "refresh_token": "unused", "token": "loopback-test-token", "expiry": "2999-01-01T00:00:00Z"}))
        proxy = f"http://127.0.0.1:{self.proxy.server_address[1]}"
        return {
            # Beam's GCS IO (google-cloud-storage)
            "STORAGE_EMULATOR_HOST": self.endpoint,
            "GOOGLE_APPLICATION_CREDENTIALS": str(credentials_path),
            "GOOGLE_CLOUD_PROJECT": "shardprep-test",
            "CLOUDSDK_CONFIG": str(self.workdir / "gcloud"),  # never a developer's own gcloud login
            # TensorFlow's GCS file system
            "GOOGLE_AUTH_TOKEN_FOR_TESTING": "loopback-test-token",
            "CURL_CA_BUNDLE": str(ca_path),
            "GCS_RETRY_CONFIG_MAX_RETRIES": "2",  # fail in seconds, not minutes, if something is wrong
            "GCS_RETRY_CONFIG_INIT_DELAY_TIME_US": "100000",
            # Every HTTPS request goes to the proxy (it forwards only Cloud Storage); loopback goes direct.
            "https_proxy": proxy, "HTTPS_PROXY": proxy, "http_proxy": proxy, "HTTP_PROXY": proxy,
            "no_proxy": "127.0.0.1,localhost", "NO_PROXY": "127.0.0.1,localhost",
            # No metadata-server probing: nothing here runs on Google Compute Engine.
            "NO_GCE_CHECK": "true", "GCE_METADATA_HOST": "127.0.0.1:9", "GCE_METADATA_IP": "127.0.0.1:9",
        }

    def stop(self) -> None:
        if self._proxy is not None:
            self._proxy.shutdown()
            self._proxy.server_close()
            self._proxy = None
        if self._emulator is not None:
            self._emulator.terminate()
            try:
                self._emulator.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._emulator.kill()
                self._emulator.wait()
            self._emulator = None

    def client(self):
        """A google-cloud-storage client for this server, for the test's own uploads and checks.

        Built explicitly (endpoint, anonymous credentials, an HTTP session that ignores proxy variables), so the
        test process needs none of :attr:`environment`.
        """
        import requests
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        session = requests.Session()
        session.trust_env = False
        return storage.Client(project="shardprep-test", credentials=AnonymousCredentials(), _http=session,
                              client_options={"api_endpoint": self.endpoint})

    @property
    def running(self) -> bool:
        return self._emulator is not None and self._emulator.poll() is None

    def __enter__(self) -> "LoopbackStorage":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
