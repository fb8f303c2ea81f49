"""Issue 10 #1: Application Default Credentials go only to Google, never in cleartext.

A logging HTTP server on loopback stands in for "some endpoint that is not Google" and a
throwaway service-account key (a fresh RSA key, token URI on the same server) stands in
for the user's ADC. Whatever the endpoint's address, no request tpulab sends there may
carry an Authorization header, and no token may be fetched for it: through the real
`tpulab list` as a subprocess and through `GoogleTpuApi` directly. A positive control
proves the rig sees a header when credentials really are attached.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from tpulab.cloud.google import GoogleTpuApi

ZONE = "us-central1-a"
PROJECT = "leak-check-project"
# Loopback addresses only: the rule must treat all of 127.0.0.0/8 alike.
HOSTS = ["127.0.0.1", "127.0.0.2"]


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]


@dataclass
class LoggingServer:
    url: str
    requests: list[Seen] = field(default_factory=list)

    def authorized(self) -> list[Seen]:
        return [r for r in self.requests if "authorization" in r.headers]


def _serve(host: str) -> Iterator[LoggingServer]:
    seen: list[Seen] = []

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            headers = {k.lower(): v for k, v in self.headers.items()}
            seen.append(Seen(self.command, self.path, headers))
            if self.path.startswith("/token"):
                body = {"access_token": "ya29.leaked", "expires_in": 3600, "token_type": "Bearer"}
            elif "/nodes" in self.path:
                body = {"nodes": []}
            elif "/queuedResources" in self.path:  # `tpulab list` covers queued resources too
                body = {"queuedResources": []}
            else:
                body = {"error": {"code": 404, "message": "no such path", "status": "NOT_FOUND"}}
            data = json.dumps(body).encode()
            self.send_response(404 if "error" in body else 200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _answer

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer((host, 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield LoggingServer(f"http://{host}:{server.server_address[1]}", seen)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture(params=HOSTS)
def logging_server(request: pytest.FixtureRequest) -> Iterator[LoggingServer]:
    yield from _serve(str(request.param))


@pytest.fixture
def service_account(tmp_path: Path, logging_server: LoggingServer) -> Path:
    """A throwaway ADC key file whose token URI is the logging server itself."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    path = tmp_path / "adc.json"
    path.write_text(
        json.dumps(
            {
                "type": "service_account",
                "project_id": PROJECT,
                "private_key_id": "throwaway",
                "private_key": pem,
                "client_email": f"leak-check@{PROJECT}.iam.gserviceaccount.com",
                "client_id": "1",
                "token_uri": f"{logging_server.url}/token",
            }
        )
    )
    return path


@pytest.fixture
def adc_env(service_account: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(service_account))
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "no-gcloud"))
    for name in ("TPULAB_PROJECT", "TPULAB_ZONE", "CLOUDSDK_CORE_PROJECT", "GOOGLE_CLOUD_PROJECT"):
        monkeypatch.delenv(name, raising=False)
    return service_account


def test_the_rig_sees_credentials_when_they_are_attached(
    logging_server: LoggingServer, adc_env: Path
) -> None:
    # Positive control: explicitly passed credentials do arrive, so the assertions
    # below would catch ADC being attached.
    from google.oauth2 import service_account

    credentials = service_account.Credentials.from_service_account_file(  # type: ignore[no-untyped-call]
        str(adc_env), scopes=["https://www.googleapis.com/auth/cloud-platform"]
    )
    api = GoogleTpuApi(PROJECT, api_endpoint=logging_server.url, credentials=credentials)
    assert api.list_nodes(ZONE) == []
    assert logging_server.authorized(), logging_server.requests


def test_google_tpu_api_sends_no_credentials_to_a_non_google_endpoint(
    logging_server: LoggingServer, adc_env: Path
) -> None:
    api = GoogleTpuApi(PROJECT, api_endpoint=logging_server.url, retry_for=0)
    assert api.list_nodes(ZONE) == []
    paths = [r.path for r in logging_server.requests]
    assert any(f"/projects/{PROJECT}/locations/{ZONE}/nodes" in p for p in paths), paths
    assert logging_server.authorized() == []
    assert not any(p.startswith("/token") for p in paths), "a token was fetched for it"


def test_tpulab_list_sends_no_credentials_to_a_non_google_endpoint(
    logging_server: LoggingServer, adc_env: Path, tmp_path: Path
) -> None:
    target = ["--api-endpoint", logging_server.url, "--project", PROJECT, "--zone", ZONE]
    done = subprocess.run(
        [sys.executable, "-m", "tpulab", "list", "--json", *target],
        capture_output=True,
        text=True,
        env={**os.environ, "TPULAB_HOME": str(tmp_path / "home")},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["nodes"] == []
    assert logging_server.requests, "tpulab list never reached the endpoint"
    assert logging_server.authorized() == []
    assert not any(r.path.startswith("/token") for r in logging_server.requests)
