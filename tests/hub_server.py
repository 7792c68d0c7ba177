"""A small Hub-compatible HTTP server on 127.0.0.1 for offline round-trip tests.

It implements the part of the Hugging Face Hub HTTP API that ``huggingface_hub`` (2.x),
``transformers``, ``peft`` and ``evaluate`` call to create repos, upload in one commit and
download files, for model, dataset and space repos:

- ``POST /api/repos/create``                               create a repo (409 when it exists)
- ``GET  /api/whoami-v2``                                  the token's user
- ``POST /api/validate-yaml``                              README front matter must be valid YAML
- ``POST /api/{type}s/{repo}/preupload/{rev}``              every file is uploaded as a "regular" blob
- ``POST /api/{type}s/{repo}/commit/{rev}``                 NDJSON commit payload (base64 files, deletions)
- ``GET  /api/{type}s/{repo}[/revision/{rev}]``             repo info (sha, siblings, cardData, sdk)
- ``GET  /api/{type}s/{repo}/tree/{rev}[/{path}]``          tree listing (``recursive``)
- ``HEAD|GET /[{type}s/]{repo}/resolve/{rev}/{path}``       file download with ``ETag``,
  ``X-Repo-Commit`` and ``Content-Length``; missing files are 404 with ``X-Error-Code: EntryNotFound``,
  missing repos ``RepoNotFound``, missing revisions ``RevisionNotFound``.

Every other request is refused loudly (HTTP 501, recorded in ``LocalHub.unhandled``) so a test
shows which client path is not implemented. Writes need ``Authorization: Bearer <token>``;
private repos need it for reads too. Blobs live in a temporary folder, repo state in memory.

``use_local_hub(monkeypatch, hub, home)`` points the already-imported client libraries at the
server (their endpoints are read at import time) and forbids connections to any other host.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

import yaml

REPO_TYPES = ("model", "dataset", "space")
_PREFIX = {"model": "", "dataset": "datasets/", "space": "spaces/"}
_LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1"}


def git_blob_sha1(data: bytes) -> str:
    """Git object id of a blob (what the Hub reports as the ETag / oid of a regular file)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class _Commit:
    oid: str
    parent: str | None
    title: str
    files: dict[str, str]  # path -> git blob sha1
    date: float


@dataclass
class _Repo:
    repo_type: str
    repo_id: str
    private: bool
    sdk: str | None
    commits: list[_Commit] = field(default_factory=list)
    branches: dict[str, str] = field(default_factory=dict)

    def resolve(self, revision: str) -> _Commit | None:
        oid = self.branches.get(revision, revision)
        for commit in self.commits:
            if commit.oid == oid:
                return commit
        return None


class HubError(Exception):
    """An HTTP error answer of the server (status, Hub error code, message)."""

    def __init__(self, status: int, code: str | None, message: str, commit: str | None = None):
        super().__init__(message)
        self.status, self.code, self.message, self.commit = status, code, message, commit


class LocalHub:
    """The server: ``with LocalHub(tmp_path) as hub: ...`` (``hub.url``, ``hub.token``)."""

    def __init__(self, root: str | Path, token: str = "hf_local_test_token", user: str = "tester"):
        self.root = Path(root)
        (self.root / "blobs").mkdir(parents=True, exist_ok=True)
        self.token, self.user = token, user
        self.repos: dict[tuple[str, str], _Repo] = {}
        self.requests: list[tuple[str, str]] = []
        self.unhandled: list[tuple[str, str]] = []
        self.lock = threading.RLock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ---------------------------------------------------------------- lifecycle
    def start(self) -> str:
        hub = self

        class Handler(_Handler):
            local_hub = hub

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="local-hub", daemon=True)
        self._thread.start()
        return self.url

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> LocalHub:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def url(self) -> str:
        assert self._server is not None, "server not started"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    # ---------------------------------------------------------------- inspection helpers
    def commits(self, repo_id: str, repo_type: str = "model") -> list[_Commit]:
        """Commits of a repo, oldest first (empty list when the repo does not exist)."""
        repo = self.repos.get((repo_type, repo_id))
        return list(repo.commits) if repo else []

    def files(self, repo_id: str, repo_type: str = "model", revision: str = "main") -> dict[str, bytes]:
        """Content of every file of a repo at a revision."""
        repo = self.repos.get((repo_type, repo_id))
        commit = repo.resolve(revision) if repo else None
        if commit is None:
            return {}
        return {path: self._blob(sha) for path, sha in commit.files.items()}

    # ---------------------------------------------------------------- storage
    def _store(self, data: bytes) -> str:
        sha = git_blob_sha1(data)
        path = self.root / "blobs" / sha
        if not path.exists():
            path.write_bytes(data)
        return sha

    def _blob(self, sha: str) -> bytes:
        return (self.root / "blobs" / sha).read_bytes()

    def _get_repo(self, repo_type: str, repo_id: str, authorized: bool) -> _Repo:
        repo = self.repos.get((repo_type, repo_id))
        if repo is None or (repo.private and not authorized):
            raise HubError(404 if repo is None else 401, "RepoNotFound", f"Repository {repo_id} not found")
        return repo

    def _get_commit(self, repo: _Repo, revision: str) -> _Commit:
        commit = repo.resolve(revision)
        if commit is None:
            raise HubError(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        return commit

    def _create_repo(self, body: dict, authorized: bool) -> tuple[int, dict]:
        if not authorized:
            raise HubError(401, None, "Invalid credentials in Authorization header")
        repo_type = body.get("type") or "model"
        if repo_type not in REPO_TYPES:
            raise HubError(400, None, f"Unknown repo type {repo_type!r}")
        name = body.get("name")
        if not name or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
            raise HubError(400, None, f"Invalid repo name {name!r}")
        repo_id = f"{body.get('organization') or self.user}/{name}"
        url = f"{self.url}/{_PREFIX[repo_type]}{repo_id}"
        if repo_type == "space" and body.get("sdk") not in ("gradio", "streamlit", "docker", "static"):
            raise HubError(400, None, "A Space needs an sdk")
        if (repo_type, repo_id) in self.repos:
            return 409, {"error": f"You already created this {repo_type} repo", "url": url}
        repo = _Repo(repo_type, repo_id, body.get("visibility") == "private" or bool(body.get("private")),
                     body.get("sdk"))
        gitattributes = b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n"
        first = _Commit(_new_oid(repo_id, "initial"), None, "initial commit",
                        {".gitattributes": self._store(gitattributes)}, time.time())
        repo.commits.append(first)
        repo.branches["main"] = first.oid
        self.repos[(repo_type, repo_id)] = repo
        return 200, {"url": url, "name": repo_id, "id": repo_id}

    def _commit(self, repo: _Repo, revision: str, payload: bytes) -> dict:
        if revision not in repo.branches:
            raise HubError(404, "RevisionNotFound", f"Cannot commit to {revision}: not a branch")
        lines = [json.loads(line) for line in payload.splitlines() if line.strip()]
        if not lines or lines[0].get("key") != "header":
            raise HubError(400, None, "The commit payload must start with a header line")
        header = lines[0]["value"]
        head = repo.resolve(revision)
        parent = header.get("parentCommit")
        if parent is not None and parent != head.oid:
            raise HubError(412, None, f"parentCommit {parent} is not the head of {revision}")
        files = dict(head.files)
        for line in lines[1:]:
            key, value = line["key"], line["value"]
            if key == "file":
                if value.get("encoding") != "base64":
                    raise HubError(400, None, f"Unsupported encoding {value.get('encoding')!r}")
                files[value["path"]] = self._store(base64.b64decode(value["content"]))
            elif key == "deletedFile":
                if value["path"] not in files:
                    raise HubError(404, "EntryNotFound", "A file with this name doesn't exist")
                del files[value["path"]]
            elif key == "deletedFolder":
                prefix = value["path"].rstrip("/") + "/"
                files = {p: s for p, s in files.items() if not p.startswith(prefix)}
            else:  # lfsFile: the server never asks for LFS uploads (preupload says "regular")
                raise HubError(501, None, f"local hub: commit operation {key!r} is not implemented")
        commit = _Commit(_new_oid(repo.repo_id, header.get("summary", "")), head.oid,
                         header.get("summary", ""), files, time.time())
        repo.commits.append(commit)
        repo.branches[revision] = commit.oid
        return {
            "commitUrl": f"{self.url}/{_PREFIX[repo.repo_type]}{repo.repo_id}/commit/{commit.oid}",
            "commitOid": commit.oid,
            "pullRequestUrl": None,
            "success": True,
        }

    def _repo_info(self, repo: _Repo, commit: _Commit) -> dict:
        info = {
            "id": repo.repo_id,
            "_id": hashlib.md5(repo.repo_id.encode()).hexdigest()[:24],
            "author": repo.repo_id.split("/")[0],
            "sha": commit.oid,
            "private": repo.private,
            "disabled": False,
            "gated": False,
            "downloads": 0,
            "likes": 0,
            "tags": [],
            "lastModified": time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(commit.date)),
            "createdAt": time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(repo.commits[0].date)),
            "siblings": [{"rfilename": path} for path in sorted(commit.files)],
        }
        if "README.md" in commit.files:
            card_data = _front_matter(self._blob(commit.files["README.md"]).decode("utf-8"))
            if card_data:
                info["cardData"] = card_data
                info["tags"] = list(card_data.get("tags") or [])
        if repo.repo_type == "space":
            info.update(sdk=repo.sdk, runtime={"stage": "NO_APP_FILE", "hardware": {"current": None}})
        return info

    def _tree(self, commit: _Commit, path: str, recursive: bool) -> list[dict]:
        prefix = path.strip("/") + "/" if path.strip("/") else ""
        if prefix and not any(p.startswith(prefix) for p in commit.files):
            if path.strip("/") in commit.files:
                sha = commit.files[path.strip("/")]
                return [{"type": "file", "oid": sha, "size": len(self._blob(sha)), "path": path.strip("/")}]
            raise HubError(404, "EntryNotFound", f"{path} does not exist")
        entries, folders = [], set()
        for file_path, sha in sorted(commit.files.items()):
            if not file_path.startswith(prefix):
                continue
            rest = file_path[len(prefix):]
            if "/" in rest and not recursive:
                folders.add(prefix + rest.split("/", 1)[0])
                continue
            if recursive:
                parts = rest.split("/")[:-1]
                folders.update(prefix + "/".join(parts[: i + 1]) for i in range(len(parts)))
            entries.append({"type": "file", "oid": sha, "size": len(self._blob(sha)), "path": file_path})
        tree_oid = lambda p: hashlib.sha1(p.encode()).hexdigest()  # noqa: E731
        return [{"type": "directory", "oid": tree_oid(f), "size": 0, "path": f} for f in sorted(folders)] + entries


def _new_oid(repo_id: str, title: str) -> str:
    return hashlib.sha1(f"{repo_id}\0{title}\0{time.time_ns()}".encode()).hexdigest()


def _front_matter(text: str) -> dict | None:
    match = re.match(r"^---\r?\n(.*?)\r?\n---\s*(\r?\n|$)", text, flags=re.S)
    if match is None:
        return None
    data = yaml.safe_load(match.group(1))
    if data is not None and not isinstance(data, dict):
        raise ValueError("The README metadata block must be a YAML mapping")
    return data or {}


_API_REPO = re.compile(r"^/api/(models|datasets|spaces)/([^/]+/[^/]+)(?:/(.*))?$")
_RESOLVE = re.compile(r"^/(?:(datasets|spaces)/)?([^/]+/[^/]+)/resolve/([^/]+)/(.+)$")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    local_hub: LocalHub

    def log_message(self, format: str, *args) -> None:  # quiet
        return

    # ------------------------------------------------------------------ plumbing
    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    self.rfile.readline()
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _authorized(self) -> bool:
        return self.headers.get("Authorization", "") == f"Bearer {self.local_hub.token}"

    def _send(self, status: int, body: bytes = b"", headers: dict | None = None,
              content_type: str = "application/json", head: bool = False) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        if "Content-Length" not in (headers or {}):
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _json(self, status: int, obj, headers: dict | None = None) -> None:
        self._send(status, json.dumps(obj).encode(), headers)

    def _dispatch(self, method: str) -> None:
        hub = self.local_hub
        split = urlsplit(self.path)
        path, query = split.path, parse_qs(split.query)
        body = self._body() if method in ("POST", "PUT") else b""
        with hub.lock:
            hub.requests.append((method, self.path))
        try:
            with hub.lock:
                handled = self._route(method, path, query, body)
            if not handled:
                with hub.lock:
                    hub.unhandled.append((method, self.path))
                msg = f"local hub: {method} {self.path} is not implemented"
                self._json(501, {"error": msg}, {"X-Error-Message": msg})
        except HubError as err:
            headers = {"X-Error-Message": err.message}
            if err.code:
                headers["X-Error-Code"] = err.code
            if err.commit:
                headers["X-Repo-Commit"] = err.commit
            if method == "HEAD":
                self._send(err.status, b"", headers, head=True)
            else:
                self._json(err.status, {"error": err.message}, headers)

    def do_GET(self) -> None:  # noqa: N802
        self._dispatch("GET")

    def do_HEAD(self) -> None:  # noqa: N802
        self._dispatch("HEAD")

    def do_POST(self) -> None:  # noqa: N802
        self._dispatch("POST")

    def do_PUT(self) -> None:  # noqa: N802
        self._dispatch("PUT")

    def do_DELETE(self) -> None:  # noqa: N802
        self._dispatch("DELETE")

    # ------------------------------------------------------------------ routes
    def _route(self, method: str, path: str, query: dict, body: bytes) -> bool:
        hub = self.local_hub
        auth = self._authorized()
        if method == "POST" and path == "/api/repos/create":
            status, obj = hub._create_repo(json.loads(body or b"{}"), auth)
            self._json(status, obj)
            return True
        if method == "GET" and path == "/api/whoami-v2":
            if not auth:
                raise HubError(401, None, "Invalid credentials in Authorization header")
            self._json(200, {"type": "user", "name": hub.user, "orgs": [], "auth": {"type": "access_token"}})
            return True
        if method == "POST" and path == "/api/validate-yaml":
            try:
                _front_matter(json.loads(body)["content"])
            except (yaml.YAMLError, ValueError) as err:
                self._json(400, {"error": f"Invalid metadata in README.md: {err}"})
                return True
            self._json(200, {"errors": [], "warnings": []})
            return True
        match = _API_REPO.match(path)
        if match:
            repo_type, repo_id, rest = match.group(1)[:-1], unquote(match.group(2)), match.group(3) or ""
            return self._repo_api(method, repo_type, repo_id, rest, query, body, auth)
        match = _RESOLVE.match(path)
        if match and method in ("GET", "HEAD"):
            repo_type = (match.group(1) or "models")[:-1]
            repo_id, revision, file_path = unquote(match.group(2)), unquote(match.group(3)), unquote(match.group(4))
            self._resolve(method, repo_type, repo_id, revision, file_path, auth)
            return True
        return False

    def _repo_api(self, method: str, repo_type: str, repo_id: str, rest: str, query: dict, body: bytes,
                  auth: bool) -> bool:
        hub = self.local_hub
        repo = hub._get_repo(repo_type, repo_id, auth)
        parts = rest.split("/", 2) if rest else []
        if method == "GET" and not parts:
            self._json(200, hub._repo_info(repo, hub._get_commit(repo, "main")))
            return True
        if method == "GET" and len(parts) >= 2 and parts[0] == "revision":
            revision = unquote("/".join(parts[1:]))
            self._json(200, hub._repo_info(repo, hub._get_commit(repo, revision)))
            return True
        if method == "GET" and len(parts) >= 2 and parts[0] == "tree":
            commit = hub._get_commit(repo, unquote(parts[1]))
            sub = unquote(parts[2]) if len(parts) == 3 else ""
            recursive = query.get("recursive", ["false"])[0].lower() in ("1", "true")
            self._json(200, hub._tree(commit, sub, recursive))
            return True
        if method == "POST" and len(parts) == 2 and parts[0] in ("preupload", "commit"):
            if not auth:
                raise HubError(401, None, "Invalid credentials in Authorization header")
            if query.get("create_pr"):
                return False  # pull requests are not implemented
            revision = unquote(parts[1])
            if parts[0] == "commit":
                self._json(200, hub._commit(repo, revision, body))
                return True
            commit = hub._get_commit(repo, revision)
            files = json.loads(body)["files"]
            self._json(200, {"files": [
                {"path": f["path"], "uploadMode": "regular", "shouldIgnore": False,
                 "oid": commit.files.get(f["path"])}
                for f in files
            ]})
            return True
        return False

    def _resolve(self, method: str, repo_type: str, repo_id: str, revision: str, file_path: str,
                 auth: bool) -> None:
        hub = self.local_hub
        repo = hub._get_repo(repo_type, repo_id, auth)
        commit = hub._get_commit(repo, revision)
        sha = commit.files.get(file_path)
        if sha is None:
            raise HubError(404, "EntryNotFound", f"Entry {file_path} not found", commit=commit.oid)
        data = hub._blob(sha)
        headers = {"ETag": f'"{sha}"', "X-Repo-Commit": commit.oid, "Accept-Ranges": "bytes"}
        status = 200
        range_header = self.headers.get("Range")
        if range_header:
            match = re.fullmatch(r"bytes=(\d+)-(\d*)", range_header.strip())
            if match is None:
                raise HubError(416, None, f"Unsupported Range {range_header!r}")
            start = int(match.group(1))
            end = int(match.group(2)) if match.group(2) else len(data) - 1
            headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
            data, status = data[start:end + 1], 206
        headers["Content-Length"] = str(len(data))
        self._send(status, data, headers, content_type="application/octet-stream", head=method == "HEAD")


# ---------------------------------------------------------------------- client wiring
def use_local_hub(monkeypatch, hub: LocalHub, home: str | Path) -> list[str]:
    """Point huggingface_hub, transformers and evaluate at ``hub`` for one test.

    Their endpoint, offline flag and cache folders are module constants read at import time,
    so setting ``HF_ENDPOINT`` is not enough once they are imported: the constants are patched
    (and restored by ``monkeypatch``). No token is configured (tests pass ``token=`` explicitly).
    Connections to any host but 127.0.0.1 are refused; the returned list records attempts.
    """
    import evaluate.config as ev_config
    import huggingface_hub.constants as hf_constants
    import huggingface_hub.hf_api as hf_api_module
    import transformers.utils.hub as tf_hub

    home = Path(home)
    url = hub.url
    env = {
        "HF_ENDPOINT": url, "HF_HUB_OFFLINE": "0", "TRANSFORMERS_OFFLINE": "0", "HF_EVALUATE_OFFLINE": "0",
        "HF_HOME": str(home), "HF_HUB_CACHE": str(home / "hub"), "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_UPDATE_DOWNLOAD_COUNTS": "0", "HF_TOKEN_PATH": str(home / "token"),
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    for key in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE"):
        monkeypatch.delenv(key, raising=False)

    for name, value in {
        "ENDPOINT": url,
        "HUGGINGFACE_CO_URL_TEMPLATE": url + "/{repo_id}/resolve/{revision}/{filename}",
        "HF_HUB_OFFLINE": False,
        "HF_HOME": str(home),
        "HF_HUB_CACHE": str(home / "hub"),
        "HF_TOKEN_PATH": str(home / "token"),
        "HF_STORED_TOKENS_PATH": str(home / "stored_tokens"),
        "HF_HUB_DISABLE_TELEMETRY": True,
    }.items():
        monkeypatch.setattr(hf_constants, name, value)
    monkeypatch.setattr(hf_api_module.api, "endpoint", url)
    monkeypatch.setattr(tf_hub, "_hf_api", None)  # transformers caches an HfApi holding the endpoint

    for name, value in {
        "HF_ENDPOINT": url,
        "HF_LIST_ENDPOINT": url + "/api/spaces?filter={type}",
        "HUB_EVALUATE_URL": url + "/spaces/{path}/resolve/{revision}/{name}",
        "HF_EVALUATE_OFFLINE": False,
        "HF_UPDATE_DOWNLOAD_COUNTS": False,
        "HF_EVALUATE_CACHE": home / "evaluate",
        "DOWNLOADED_EVALUATE_PATH": home / "evaluate" / "downloads",
        "HF_METRICS_CACHE": home / "metrics",
        # HF_MODULES_CACHE stays: evaluate imports metric scripts as the package `evaluate_modules`
        # found through sys.path, so moving it would break later evaluate.load calls in the session.
    }.items():
        monkeypatch.setattr(ev_config, name, value)

    foreign: list[str] = []
    real_getaddrinfo = socket.getaddrinfo

    def guarded_getaddrinfo(host, *args, **kwargs):
        name = host.decode() if isinstance(host, bytes) else str(host)
        if name not in _LOCAL_HOSTS:
            foreign.append(name)
            raise OSError(f"test network guard: connection to {name} refused (only the local hub is allowed)")
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", guarded_getaddrinfo)
    return foreign
