"""A local stand-in for the Hugging Face hub, enough for huggingface_hub's file downloads.

Two HTTP servers on 127.0.0.1: the hub, which answers HEAD/GET on
``/{repo_id}/resolve/{revision}/{filename}`` like huggingface.co does for LFS files (a 302
to the CDN carrying X-Repo-Commit, X-Linked-Etag = the sha256 and X-Linked-Size), and the
"CDN", another origin that serves the bytes with Range support. With ``redirect=False``
the hub serves the bytes itself (ETag = sha256), as it does for files it hosts directly.

Switches, for failure tests:
- ``drop_at`` / ``drops``: cut the connection once the body reaches byte ``drop_at``, for
  the next ``drops`` GETs that cross it;
- ``corrupt``: serve altered bytes under the right sha256;
- ``requests``: every request seen, as (method, path, Range header or None).

    with FakeHub() as hub:
        hub.add("ggml-org/SmolLM3-3B-GGUF", "SmolLM3-Q4_K_M.gguf", data)
        os.environ["HF_ENDPOINT"] = hub.endpoint
"""

from __future__ import annotations

import hashlib
import re
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote

COMMIT = "0123456789abcdef0123456789abcdef01234567"
RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<revision>[^/]+)/(?P<filename>.+)$")
BLOB = re.compile(r"^/blobs/(?P<sha>[0-9a-f]{64})$")
RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")


@dataclass
class Seen:
    method: str
    path: str
    range: str | None


class FakeHub:
    def __init__(self, redirect: bool = True):
        self.redirect = redirect
        self.files: dict[tuple[str, str], bytes] = {}
        self.blobs: dict[str, bytes] = {}
        self.requests: list[Seen] = []
        self.drop_at: int | None = None
        self.drops = 0
        self.corrupt = False
        self._lock = threading.Lock()
        self._hub = ThreadingHTTPServer(("127.0.0.1", 0), self._handler(serves_resolve=True))
        self._cdn = ThreadingHTTPServer(("127.0.0.1", 0), self._handler(serves_resolve=False))
        for server in (self._hub, self._cdn):
            server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self._hub.server_address[1]}"
        self.cdn = f"http://127.0.0.1:{self._cdn.server_address[1]}"

    def add(self, repo_id: str, filename: str, data: bytes) -> str:
        sha = hashlib.sha256(data).hexdigest()
        self.files[(repo_id, filename)] = data
        self.blobs[sha] = data
        return sha

    def gets(self) -> list[Seen]:
        return [r for r in self.requests if r.method == "GET"]

    def __enter__(self) -> FakeHub:
        for server in (self._hub, self._cdn):
            threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        for server in (self._hub, self._cdn):
            server.shutdown()
            server.server_close()

    def _take_drop(self, start: int, end: int) -> int | None:
        """The byte to cut the body at, if a drop is armed and falls in [start, end)."""
        with self._lock:
            if self.drops > 0 and self.drop_at is not None and start <= self.drop_at < end:
                self.drops -= 1
                return self.drop_at
        return None

    def _handler(self, serves_resolve: bool):
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # keep pytest output clean
                pass

            def do_HEAD(self):
                self._answer(body=False)

            def do_GET(self):
                self._answer(body=True)

            def _answer(self, body: bool) -> None:
                path = unquote(self.path.split("?", 1)[0])
                hub.requests.append(Seen(self.command, path, self.headers.get("Range")))
                if serves_resolve:
                    match = RESOLVE.match(path)
                    if not match:
                        return self._error(404, "RepoNotFound")
                    repo, filename = match["repo"], match["filename"]
                    if not any(r == repo for r, _ in hub.files):
                        return self._error(401, "RepoNotFound")
                    data = hub.files.get((repo, filename))
                    if data is None:
                        return self._error(404, "EntryNotFound")
                    sha = hashlib.sha256(data).hexdigest()
                    if hub.redirect:
                        self.send_response(302)
                        self.send_header("Location", f"{hub.cdn}/blobs/{sha}")
                        self.send_header("X-Repo-Commit", COMMIT)
                        self.send_header("X-Linked-Etag", f'"{sha}"')
                        self.send_header("X-Linked-Size", str(len(data)))
                        self.send_header("ETag", '"not-the-file-etag"')
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    return self._send(data, sha, body)
                match = BLOB.match(path)
                data = hub.blobs.get(match["sha"]) if match else None
                if data is None:
                    return self._error(404, "EntryNotFound")
                return self._send(data, match["sha"], body)

            def _send(self, data: bytes, sha: str, body: bool) -> None:
                if hub.corrupt:
                    data = bytearray(data)
                    data[len(data) // 2] ^= 0xFF
                    data = bytes(data)
                total, start, end = len(data), 0, len(data)
                asked = self.headers.get("Range")
                if asked:
                    match = RANGE.match(asked.strip())
                    if not match or int(match[1]) >= total:
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{total}")
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    start = int(match[1])
                    end = min(int(match[2]) + 1, total) if match[2] else total
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{end - 1}/{total}")
                else:
                    self.send_response(200)
                self.send_header("Content-Length", str(end - start))
                self.send_header("Accept-Ranges", "bytes")
                self.send_header("ETag", f'"{sha}"')
                self.send_header("X-Repo-Commit", COMMIT)
                self.send_header("Content-Type", "application/octet-stream")
                self.end_headers()
                if not body:
                    return
                cut = hub._take_drop(start, end)
                if cut is not None:
                    self.wfile.write(data[start:cut])
                    self.wfile.flush()
                    self.close_connection = True  # the client sees the body end early
                    return
                self.wfile.write(data[start:end])

            def _error(self, status: int, code: str) -> None:
                message = f"{code}: {self.path}".encode()
                self.send_response(status)
                self.send_header("X-Error-Code", code)
                self.send_header("X-Error-Message", code)
                self.send_header("X-Repo-Commit", COMMIT)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(message)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(message)

        return Handler
