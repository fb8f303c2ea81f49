"""One emulated VM's metadata server: GCE's `/computeMetadata/v1/` on a loopback port.

Each booted node gets its own server (its own port), so a node's processes, which are
told only their own address (`GCE_METADATA_HOST`), see only their own identity and
token, as on a real VM where 169.254.169.254 answers for the VM asking.

What it answers, as GCE does (paths under /computeMetadata/v1/):
- `instance/attributes/` (every node metadata key plus the TPU service's own:
  `tpu-env`, `accelerator-type`, `agent-worker-number`, `instance-id`,
  `worker-network-endpoints`),
  `instance/{id,name,hostname,zone,preempted}`, `project/{project-id,numeric-project-id}`,
  `instance/service-accounts/{default,<email>}/{email,scopes,aliases,token}`;
- `instance/guest-attributes/<namespace>/<key>`: GET, PUT (the body is the value) and
  DELETE; what is written appears in the TPU API's getGuestAttributes;
- directories list their entries one per line (sub-directories end in "/"),
  `?recursive=true` answers a directory as JSON (camelCase keys, as GCE), `?alt=json`
  answers JSON, `?alt=text` text;
- every request must carry `Metadata-Flavor: Google` and must not carry
  `X-Forwarded-For` (403 otherwise); every answer carries `Metadata-Flavor: Google`,
  which google-auth checks before it trusts the server. `wait_for_change` is not
  emulated: such requests answer at once.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol
from urllib.parse import parse_qs, unquote, urlsplit

from tpulab.contract import METADATA_FLAVOR, METADATA_FLAVOR_HEADER, METADATA_ROOT_PATH
from tpulab.emulator.iam import identity_of, project_number
from tpulab.emulator.workers import worker_attributes, worker_network_endpoints

__all__ = ["MetadataServer", "NodeLink", "metadata_tree", "tpu_env"]

log = logging.getLogger(__name__)

Record = dict[str, Any]
# A value in the tree: a leaf (str, int, list of str) or a directory (dict).
Tree = dict[str, Any]


class NodeLink(Protocol):
    """The metadata server's view of its node, in the emulator's state."""

    def node(self) -> Record | None:
        """The node's record now (a copy), None once it is gone."""
        ...

    def token(self) -> tuple[str, int] | None:
        """(access token, seconds left) of the node's identity; None once it is gone."""
        ...

    def set_guest_attribute(self, path: str, value: str | None) -> bool:
        """Write (None: delete) `namespace/key`; False once the node is gone or its VM
        has stopped."""
        ...


class _Verbatim(dict[str, Any]):
    """A directory whose keys are data (attribute names, emails): never camelCased."""


def tpu_env(node: Record, worker: int = 0) -> str:
    """The TPU service's `tpu-env` attribute of worker `worker`: `KEY: 'value'` lines,
    the format JAX's cloud_tpu_cluster.py parses (split at the first ':', strip spaces,
    then quotes)."""
    values = {
        "ACCELERATOR_TYPE": node["accelerator_type"],
        "CONSUMER_PROJECT_ID": node["project"],
        "CONSUMER_PROJECT_NUMBER": project_number(node["project"]),
        "NODE_ID": node["name"],
        "RUNTIME_VERSION": node["runtime_version"],
        "WORKER_ID": str(worker),
        "ZONE": node["zone"],
    }
    return "".join(f"{key}: '{value}'\n" for key, value in sorted(values.items()))


def vm_name(node: Record, worker: int = 0) -> str:
    """The GCE VM's name under the node: TPU VMs are `t1v-n-<8 hex>-w-<worker>`, not the
    node's name (which code on the VM must take from tpu-env's NODE_ID). A Compute
    Engine instance (instances.py) is its own VM: its name is the instance's."""
    if node.get("api") == "compute":
        return str(node["name"])
    return f"t1v-n-{int(node['id']) % 0xFFFFFFFF:08x}-w-{worker}"


def metadata_tree(node: Record, worker: int = 0) -> Tree:
    """Everything the server of worker `worker` answers for `node` except the token
    (never in listings). Every worker of a slice has its own metadata server: its own
    `agent-worker-number`, tpu-env WORKER_ID, name and guest attributes; the node's
    metadata, identity and `worker-network-endpoints` (every worker's) are shared."""
    email, scopes = identity_of(node)
    account = {"aliases": ["default"], "email": email, "scopes": scopes}
    attributes = _Verbatim(
        {
            **node["metadata"],
            "accelerator-type": node["accelerator_type"],
            "agent-worker-number": str(worker),
            "instance-id": str(node["id"]),
            "tpu-env": tpu_env(node, worker),
            "worker-network-endpoints": worker_network_endpoints(node),
        }
    )
    guest = _Verbatim()
    for path, value in worker_attributes(node, worker).items():
        namespace, _, key = path.partition("/")
        guest.setdefault(namespace, _Verbatim())[key] = value
    number = project_number(node["project"])
    return {
        "instance": {
            "attributes": attributes,
            "guest-attributes": guest,
            "hostname": f"{vm_name(node, worker)}.{node['zone']}.c.{node['project']}.internal",
            "id": int(node["id"]),
            "name": vm_name(node, worker),
            "preempted": "TRUE" if _preempted(node) else "FALSE",
            "service-accounts": _Verbatim({"default": account, email: dict(account)}),
            "zone": f"projects/{number}/zones/{node['zone']}",
        },
        "project": {"numeric-project-id": int(number), "project-id": node["project"]},
    }


def _preempted(node: Record) -> bool:
    """`instance/preempted`: TRUE from the preemption notice on (the VM still runs for
    `preempt_notice` s), and in the states a reclaimed node ends in."""
    return node.get("preempt_notice_at") is not None or node["state"] in {
        "PREEMPTED",
        "TERMINATED",
    }


def _camel(name: str) -> str:
    head, *rest = name.split("-")
    return head + "".join(part.title() for part in rest)


def _as_json(value: Any) -> Any:
    if isinstance(value, _Verbatim):
        return {k: _as_json(v) for k, v in value.items()}
    if isinstance(value, dict):
        # GCE keeps guest attributes out of recursive dumps (ask for them by path).
        return {_camel(k): _as_json(v) for k, v in value.items() if k != "guest-attributes"}
    return value


def _as_text(value: Any) -> str:
    if isinstance(value, dict):
        return "".join(f"{k}/\n" if isinstance(v, dict) else f"{k}\n" for k, v in value.items())
    if isinstance(value, list):
        return "".join(f"{item}\n" for item in value)
    return str(value)


def _lookup(tree: Tree, parts: list[str]) -> Any:
    value: Any = tree
    for part in parts:
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


class MetadataServer:
    """The metadata server of one worker VM of a node (worker 0: a single-host node's
    only VM); `start()` returns its `host:port`."""

    def __init__(self, link: NodeLink, host: str = "127.0.0.1", *, worker: int = 0) -> None:
        self.link = link
        self.worker = worker
        self._host = host
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.address = ""

    def start(self) -> str:
        server = ThreadingHTTPServer((self._host, 0), _make_handler(self.link, self.worker))
        server.daemon_threads = True
        self._server = server
        self.address = f"{self._host}:{server.server_address[1]}"
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"tpu-emulator-metadata-{self.address}",
            daemon=True,
        )
        self._thread.start()
        return self.address

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)


def _make_handler(link: NodeLink, worker: int) -> type[BaseHTTPRequestHandler]:
    class _Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # TCP_NODELAY: the headers and the body go out as two writes, and on a kept-alive
        # connection Nagle held the body until the client's delayed ACK of the headers:
        # 48 ms a request instead of 2 (tests/benchmarks/bench_api_latency.py). Google's
        # front ends answer without that stall.
        disable_nagle_algorithm = True
        server_version = "Metadata Server for VM"  # GCE's Server header
        sys_version = ""
        timeout = 30

        def _answer(self, status: int, body: str, content_type: str = "application/text") -> None:
            payload = body.encode("utf-8")
            self.send_response(status)
            self.send_header(METADATA_FLAVOR_HEADER, METADATA_FLAVOR)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(payload)

        def _refused(self) -> bool:
            if self.headers.get("X-Forwarded-For") is not None:
                self._answer(403, "Request contains an X-Forwarded-For header; refused.\n")
                return True
            if self.headers.get(METADATA_FLAVOR_HEADER) != METADATA_FLAVOR:
                # GCE's own words for a request without the header.
                self._answer(
                    403,
                    "Your client does not have permission to get URL "
                    f"{urlsplit(self.path).path} from this server. Missing "
                    f"{METADATA_FLAVOR_HEADER}:{METADATA_FLAVOR} header.\n",
                )
                return True
            return False

        def _parts(self) -> tuple[list[str] | None, dict[str, list[str]], bool]:
            split = urlsplit(self.path)
            path = unquote(split.path)
            query = parse_qs(split.query)
            root = METADATA_ROOT_PATH.rstrip("/")
            if path != root and not path.startswith(METADATA_ROOT_PATH):
                return None, query, False
            rest = path[len(root) :].strip("/")
            return ([p for p in rest.split("/") if p] if rest else []), query, path.endswith("/")

        def do_GET(self) -> None:
            if self._refused():
                return
            parts, query, _ = self._parts()
            if parts is None:
                self._answer(*_above_root(urlsplit(self.path).path))
                return
            node = link.node()
            if node is None:
                self._answer(503, "The instance is shutting down.\n")
                return
            if _is_token(parts) and parts[2] in {"default", identity_of(node)[0]}:
                got = link.token()
                if got is None:
                    self._answer(503, "The instance is shutting down.\n")
                    return
                token, expires_in = got
                body = {"access_token": token, "expires_in": expires_in, "token_type": "Bearer"}
                self._answer(200, json.dumps(body), "application/json")
                return
            value = _lookup(metadata_tree(node, worker), parts)
            if value is None:
                self._answer(404, "Not found\n")
                return
            self._render(value, query)

        do_HEAD = do_GET

        def _render(self, value: Any, query: Mapping[str, list[str]]) -> None:
            alt = (query.get("alt") or [""])[0]
            recursive = (query.get("recursive") or ["false"])[0].lower() == "true"
            if isinstance(value, dict) and recursive and alt != "text":
                self._answer(200, json.dumps(_as_json(value)), "application/json")
            elif alt == "json":
                rendered = list(value) if isinstance(value, dict) else _as_json(value)
                self._answer(200, json.dumps(rendered), "application/json")
            else:
                self._answer(200, _as_text(value))

        def _guest_path(self) -> str | None:
            parts, _, _ = self._parts()
            if parts is None or len(parts) != 4 or parts[:2] != ["instance", "guest-attributes"]:
                return None
            return f"{parts[2]}/{parts[3]}"

        def do_PUT(self) -> None:
            if self._refused():
                return
            length = int(self.headers.get("Content-Length") or 0)
            self._set_guest(self.rfile.read(length).decode("utf-8", "replace") if length else "")

        def do_DELETE(self) -> None:
            if not self._refused():
                self._set_guest(None)

        def _set_guest(self, value: str | None) -> None:
            """PUT (a value) or DELETE (None) the guest attribute the path names."""
            path = self._guest_path()
            if path is None:
                self._answer(405, "Only instance/guest-attributes/<namespace>/<key> is writable.\n")
            elif not link.set_guest_attribute(path, value):
                self._answer(503, "The instance is shutting down.\n")
            else:
                self._answer(200, "")

        def do_POST(self) -> None:
            if not self._refused():
                self._answer(405, "Method not allowed.\n")

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("metadata %s - %s", self.address_string(), format % args)

    return _Handler


def _above_root(path: str) -> tuple[int, str]:
    # GCE lists the versions above /computeMetadata/v1/; google-auth's ping GETs "/".
    listing = {"/": "computeMetadata/\n", "/computeMetadata": "v1/\n"}.get(path.rstrip("/") or "/")
    return (200, listing) if listing is not None else (404, "Not found\n")


def _is_token(parts: list[str]) -> bool:
    return len(parts) == 4 and parts[:2] == ["instance", "service-accounts"] and parts[3] == "token"
