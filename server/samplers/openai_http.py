"""A small synchronous client for an OpenAI-compatible inference server (vLLM's `vllm serve`).

It knows the four routes the sampler needs: `/v1/models`, `/v1/completions`,
`/v1/load_lora_adapter` and `/v1/unload_lora_adapter`. Connection failures and 502/503/504
answers are retried with exponential backoff; every other failure becomes a `VLLMError` (a
`RuntimeError`, so the service reports it as a server error, never as the user's fault) carrying
the server's own message. It is thread-safe: one `httpx.Client` and its connection pool are
shared by the sampler's worker threads.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import httpx

log = logging.getLogger(__name__)

RETRY_STATUSES = {502, 503, 504}


class VLLMError(RuntimeError):
    """The sampling backend failed; reported to clients as a `server` error."""


class VLLMUnavailable(VLLMError):
    """The inference server cannot be reached (after retries)."""


class VLLMRequestError(VLLMError):
    """The inference server answered with an error status."""

    def __init__(self, route: str, status: int, message: str):
        super().__init__(f"vLLM {route} answered {status}: {message}")
        self.route, self.status, self.message = route, status, message


def _error_message(response: httpx.Response) -> str:
    """vLLM's error text, from either of its error shapes or FastAPI's `detail`."""
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()[:500] or response.reason_phrase
    if isinstance(body, dict):
        inner = body.get("error")
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])
        for key in ("message", "detail"):
            if body.get(key):
                return str(body[key])
    return str(body)[:500]


class OpenAICompatClient:
    """HTTP calls to one inference server, with timeouts and retries."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        timeout_s: float = 600.0,
        connect_timeout_s: float = 5.0,
        retries: int = 3,
        backoff_s: float = 0.5,
        max_connections: int = 64,
        transport: httpx.BaseTransport | None = None,
    ):
        root = base_url.rstrip("/")
        self.base_url = root[: -len("/v1")] if root.endswith("/v1") else root
        self.retries, self.backoff_s = retries, backoff_s
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(
            base_url=self.base_url,
            headers=headers,
            timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s),
            limits=httpx.Limits(max_connections=max_connections,
                                max_keepalive_connections=max_connections),
            transport=transport,
        )

    def close(self) -> None:
        self._http.close()

    def _call(self, method: str, route: str, body: dict[str, Any] | None = None) -> httpx.Response:
        attempt = 0
        while True:
            try:
                response = self._http.request(method, route, json=body)
            except httpx.TransportError as exc:
                if attempt >= self.retries:
                    raise VLLMUnavailable(
                        f"vLLM at {self.base_url} unreachable ({route}): "
                        f"{type(exc).__name__}: {exc}") from exc
                failure = f"{type(exc).__name__}: {exc}"
            else:
                if response.status_code not in RETRY_STATUSES or attempt >= self.retries:
                    return response
                failure = f"status {response.status_code}"
            delay = self.backoff_s * 2**attempt
            log.warning("vLLM %s failed (%s); retry %d/%d in %.1fs", route, failure, attempt + 1,
                        self.retries, delay)
            time.sleep(delay)
            attempt += 1

    def _json(self, method: str, route: str, body: dict[str, Any] | None = None) -> Any:
        response = self._call(method, route, body)
        if response.status_code >= 400:
            raise VLLMRequestError(route, response.status_code, _error_message(response))
        try:
            return response.json()
        except ValueError as exc:
            raise VLLMError(f"vLLM {route} answered with invalid JSON") from exc

    # ---------------------------------------------------------------- routes
    def models(self) -> list[dict[str, Any]]:
        """`/v1/models`: the served base model(s) and every loaded adapter."""
        return list(self._json("GET", "/v1/models").get("data") or [])

    def completions(self, body: dict[str, Any]) -> dict[str, Any]:
        return self._json("POST", "/v1/completions", body)

    def load_lora_adapter(self, name: str, path: str) -> None:
        """Hot-load an adapter; a name the server already holds counts as loaded."""
        response = self._call("POST", "/v1/load_lora_adapter",
                              {"lora_name": name, "lora_path": path})
        if response.status_code < 400:
            return
        message = _error_message(response)
        if "already been loaded" in message:
            return
        if response.status_code == 404 and message == "Not Found":
            message = ("the server has no runtime LoRA routes; start vLLM with "
                       "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True and --enable-lora")
        raise VLLMRequestError("/v1/load_lora_adapter", response.status_code, message)

    def unload_lora_adapter(self, name: str) -> None:
        """Unload an adapter; one the server does not hold counts as unloaded."""
        response = self._call("POST", "/v1/unload_lora_adapter", {"lora_name": name})
        if response.status_code < 400 or response.status_code == 404:
            return
        raise VLLMRequestError("/v1/unload_lora_adapter", response.status_code,
                               _error_message(response))
