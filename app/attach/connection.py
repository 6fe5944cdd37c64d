"""Talking to a server the TUI is attached to: its address, its errors in the engine
client's terms, and the backoff between reconnection attempts."""

import random
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx

from kvdeck.engine.api.async_llm import EngineDeadError, RequestFailedError

BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 10.0


class RemoteAuthError(RuntimeError):
    """The server refused the API key (or wants one and none was given)."""


@dataclass(slots=True)
class RemoteHealth:
    status: str  # "starting" (connecting) | "ready" | "dead" (disconnected, retrying) | "stopped"
    detail: str


@dataclass(slots=True)
class RemoteProgress:
    stage: str
    message: str


@dataclass(slots=True)
class Backoff:
    """Exponential, capped, with jitter so replicas that dropped together do not reconnect
    in lockstep."""

    first_s: float = BACKOFF_FIRST_S
    max_s: float = BACKOFF_MAX_S
    attempt: int = 0

    def next_delay(self) -> float:
        delay = min(self.max_s, self.first_s * 2 ** self.attempt)
        self.attempt += 1
        return delay * random.uniform(0.8, 1.0)

    def reset(self) -> None:
        self.attempt = 0


def normalise_url(url: str) -> str:
    """`host:port` or a full URL, to the server's base URL (no trailing slash, no /v1)."""
    url = url.strip()
    if "://" not in url:
        url = f"http://{url}"
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{url!r} is not an http(s) URL of a server (e.g. http://HOST:PORT)")
    path = parts.path.rstrip("/").removesuffix("/v1")
    return f"{parts.scheme}://{parts.netloc}{path}"


def error_message(response: httpx.Response) -> str:
    """The OpenAI error's message, or what the body says."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        if isinstance(body.get("detail"), str):
            return body["detail"]
    text = response.text.strip()
    return text[:300] if text else response.reason_phrase


def refused(response: httpx.Response, url: str) -> Exception:
    """A non-2xx answer as the exception a local engine would raise for the same case."""
    status, message = response.status_code, error_message(response)
    if status in (401, 403):
        return RemoteAuthError(
            f"the server at {url} refused the API key ({status}: {message}); pass the key it "
            "was started with: kvdeck attach URL --api-key KEY (or set KVDECK_API_KEY)")
    if status in (400, 404, 413, 422):
        return ValueError(message)
    if status == 503:
        return EngineDeadError(f"the server at {url} cannot serve now: {message}")
    return RequestFailedError(f"the server at {url} answered {status}: {message}")


def transport_reason(exc: BaseException) -> str:
    """A short, readable reason for a connection failure."""
    match exc:
        case httpx.ConnectTimeout() | httpx.ConnectError():
            return "cannot connect"
        case httpx.ReadTimeout():
            return "the server stopped answering"
        case httpx.RemoteProtocolError():
            return "the server closed the connection"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
