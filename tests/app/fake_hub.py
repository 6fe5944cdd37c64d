"""A Hugging Face hub look-alike on 127.0.0.1 for download tests.

Implements what huggingface_hub 2.4's client calls: model info with file metadata
(`/api/models/{repo}/revision/{rev}?blobs=true`) and file resolve (`/{repo}/resolve/{rev}/{file}`,
HEAD with X-Repo-Commit / ETag / X-Linked-Etag / X-Linked-Size, GET with Range). Faults can
be injected: drop the connection mid-file, serve corrupted bytes, gate a repo.
"""

import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

GOOD_TOKEN = "hf_test_good_token"


@dataclass
class FakeRepo:
    files: dict[str, bytes]
    commit: str
    gated: bool = False

    @classmethod
    def from_dir(cls, folder: Path, gated: bool = False) -> "FakeRepo":
        files = {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}
        commit = hashlib.sha1(b"".join(files[n] for n in sorted(files))).hexdigest()
        return cls(files=files, commit=commit, gated=gated)


def is_lfs(name: str) -> bool:
    return name.endswith(".safetensors")


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class FakeHub:
    repos: dict[str, FakeRepo] = field(default_factory=dict)
    drop_once: dict[tuple[str, str], int] = field(default_factory=dict)  # -> byte offset
    corrupt: set[tuple[str, str]] = field(default_factory=set)
    log: list[tuple[str, str, str | None]] = field(default_factory=list)  # method, path, Range
    bytes_sent: dict[str, int] = field(default_factory=dict)
    url: str = ""

    def start(self) -> "FakeHub":
        hub = self

        class Handler(_Handler):
            fake = hub

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def gets_of(self, filename: str) -> list[str | None]:
        return [rng for method, path, rng in self.log if method == "GET" and path.endswith(filename)]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    fake: FakeHub

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self._handle(head=False)

    def do_HEAD(self) -> None:
        self._handle(head=True)

    def _handle(self, head: bool) -> None:
        parsed = urlparse(self.path)
        path = unquote(parsed.path)
        self.fake.log.append((self.command, path, self.headers.get("Range")))
        if path.startswith("/api/models/"):
            return self._model_info(path[len("/api/models/") :])
        if "/resolve/" in path:
            repo_id, rest = path.lstrip("/").split("/resolve/", 1)
            _revision, filename = rest.split("/", 1)
            return self._resolve(repo_id, filename, head)
        self._error(404, "EntryNotFound")

    def _repo(self, repo_id: str) -> FakeRepo | None:
        repo = self.fake.repos.get(repo_id)
        if repo is None:
            # The real hub answers 401 + RepoNotFound to anonymous callers for unknown repos.
            self._error(401 if self.headers.get("Authorization") is None else 404, "RepoNotFound")
        return repo

    def _authorized(self) -> bool:
        return self.headers.get("Authorization") == f"Bearer {GOOD_TOKEN}"

    def _model_info(self, rest: str) -> None:
        repo_id = rest.split("/revision/")[0]
        repo = self._repo(repo_id)
        if repo is None:
            return
        siblings = []
        for name, data in repo.files.items():
            entry = {"rfilename": name, "size": len(data), "blobId": git_blob_id(data)}
            if is_lfs(name):
                entry["lfs"] = {
                    "size": len(data),
                    "sha256": hashlib.sha256(data).hexdigest(),
                    "pointerSize": 134,
                }
            siblings.append(entry)
        body = {
            "id": repo_id,
            "sha": repo.commit,
            "gated": "auto" if repo.gated else False,
            "private": False,
            "siblings": siblings,
        }
        self._send(200, json.dumps(body).encode(), {"Content-Type": "application/json"})

    def _resolve(self, repo_id: str, filename: str, head: bool) -> None:
        repo = self._repo(repo_id)
        if repo is None:
            return
        if repo.gated and not self._authorized():
            return self._error(401, "GatedRepo")
        data = repo.files.get(filename)
        if data is None:
            return self._error(404, "EntryNotFound", {"X-Repo-Commit": repo.commit})
        key = (repo_id, filename)
        headers = {"X-Repo-Commit": repo.commit, "Accept-Ranges": "bytes"}
        if is_lfs(filename):
            sha = hashlib.sha256(data).hexdigest()
            headers |= {"ETag": f'"{git_blob_id(data)}"', "X-Linked-Etag": f'"{sha}"',
                        "X-Linked-Size": str(len(data))}  # fmt: skip
        else:
            headers["ETag"] = f'"{git_blob_id(data)}"'
        if head:
            headers["Content-Length"] = str(len(data))
            return self._send(200, b"", headers, head=True)
        if key in self.fake.corrupt:
            data = bytes([data[0] ^ 0xFF]) + data[1:]  # same size, wrong bytes
        start = 0
        status = 200
        rng = self.headers.get("Range")
        if rng and rng.startswith("bytes=") and rng.endswith("-"):
            start = int(rng[len("bytes=") : -1])
            status = 206
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        body = data[start:]
        drop_at = self.fake.drop_once.pop(key, None)
        if drop_at is not None:
            cut = drop_at - start
            headers["Content-Length"] = str(len(body))
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body[:cut])
            self.wfile.flush()
            self._count(filename, cut)
            self.close_connection = True  # the client sees a body shorter than Content-Length
            return
        self._send(status, body, headers)
        self._count(filename, len(body))

    def _count(self, filename: str, count: int) -> None:
        self.fake.bytes_sent[filename] = self.fake.bytes_sent.get(filename, 0) + count

    def _error(self, status: int, code: str, extra: dict | None = None) -> None:
        headers = {"X-Error-Code": code, "Content-Type": "application/json"} | (extra or {})
        self._send(status, json.dumps({"error": code}).encode(), headers)

    def _send(self, status: int, body: bytes, headers: dict, head: bool = False) -> None:
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        if "Content-Length" not in headers:
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head and self.command != "HEAD":
            self.wfile.write(body)
