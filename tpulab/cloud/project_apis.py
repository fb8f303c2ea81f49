"""The project-level REST APIs tpulab's checks ask (Service Usage, Resource Manager and
Compute's networks), over one `requests` session at Google or at one emulator URL
(tpulab/emulator/project_apis.py serves the same paths), and `Check`, what each check of
`tpulab.cloud.preflight` and `tpulab.cloud.network_checks` answers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from tpulab.errors import UnreachableError

__all__ = ["Body", "Check", "CheckStatus", "ProjectApis", "api_message", "error_reason"]

CheckStatus = Literal["ok", "problem", "unknown"]
Body = dict[str, Any]

_GOOGLE_BASES = {
    "serviceusage": "https://serviceusage.googleapis.com/v1/",
    "cloudresourcemanager": "https://cloudresourcemanager.googleapis.com/v1/",
    "compute": "https://compute.googleapis.com/compute/v1/",
}
_LOCAL_PATHS = {"serviceusage": "v1/", "cloudresourcemanager": "v1/", "compute": "compute/v1/"}


@dataclass(frozen=True)
class Check:
    """One check's answer: `summary` says what was found, `fix` what to do (None: ok)."""

    name: str
    status: CheckStatus
    summary: str
    fix: str | None = None


class ProjectApis:
    """Service Usage, Resource Manager and Compute over one `requests` session, at
    Google (`api_endpoint` None) or at one emulator URL that serves all three."""

    def __init__(self, session: Any, api_endpoint: str | None, *, timeout: float = 30.0) -> None:
        self._session = session
        self._endpoint = api_endpoint
        self._timeout = timeout

    def url(self, api: str, path: str) -> str:
        if self._endpoint is None:
            return _GOOGLE_BASES[api] + path
        return f"{self._endpoint.rstrip('/')}/{_LOCAL_PATHS[api]}{path}"

    def get(self, api: str, path: str, params: dict[str, str] | None = None) -> tuple[int, Body]:
        return self._send("GET", self.url(api, path), params=params)

    def post(self, api: str, path: str, body: Body) -> tuple[int, Body]:
        return self._send("POST", self.url(api, path), json=body)

    def _send(self, method: str, url: str, **kwargs: Any) -> tuple[int, Body]:
        """(HTTP status, JSON body). No answer at all is not a check's "unknown": the
        whole doctor cannot work, so it is raised (UnreachableError)."""
        import requests

        try:
            answer = self._session.request(method, url, timeout=self._timeout, **kwargs)
        except requests.RequestException as error:
            raise UnreachableError(
                f"Could not reach {url.split('/v1/')[0]}: {type(error).__name__}.",
                status="UNAVAILABLE",
                api_message=str(error)[:300],
                hint="Check the network (or, for --api-endpoint, that the emulator runs).",
            ) from None
        try:
            body = answer.json()
        except ValueError:
            body = {}
        return int(answer.status_code), body if isinstance(body, dict) else {}


def api_message(body: Body) -> str:
    error = body.get("error")
    return str(error.get("message") or "") if isinstance(error, dict) else ""


def error_reason(body: Body) -> str:
    """The ErrorInfo reason of a Google error body (SERVICE_DISABLED, ...), or ""."""
    error = body.get("error")
    details = error.get("details") if isinstance(error, dict) else None
    for detail in details if isinstance(details, list) else []:
        if isinstance(detail, dict) and str(detail.get("@type", "")).endswith("ErrorInfo"):
            return str(detail.get("reason") or "")
    return ""
