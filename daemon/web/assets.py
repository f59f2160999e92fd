"""The vendored static files (chart library, script, styles), read once and served from memory.

Starlette's ``StaticFiles`` stats and reads the file in a worker thread on every request; these few
files never change while the daemon runs, so each is read at start-up, hashed into an ``ETag`` and
answered from memory (``304`` when the browser already holds it). Under HTTP load that is GIL time
handed back to the ingest.
"""

from __future__ import annotations

import hashlib
import mimetypes
from importlib import resources

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

_PACKAGE = "trainvigil.daemon.web"


class Assets:
    """``GET /static/{name}`` for the files in the package's ``static/`` folder."""

    def __init__(self) -> None:
        self._files: dict[str, tuple[bytes, str, str]] = {}
        for entry in resources.files(_PACKAGE).joinpath("static").iterdir():
            if entry.is_file():
                body = entry.read_bytes()
                kind = mimetypes.guess_type(entry.name)[0] or "application/octet-stream"
                if kind.startswith("text/") or kind.endswith("javascript"):
                    kind += "; charset=utf-8"
                etag = '"' + hashlib.sha256(body).hexdigest()[:20] + '"'
                self._files[entry.name] = (body, kind, etag)

    @property
    def names(self) -> list[str]:
        return sorted(self._files)

    async def serve(self, request: Request) -> Response:
        found = self._files.get(request.path_params["name"])
        if found is None:
            return PlainTextResponse("no such file\n", status_code=404)
        body, kind, etag = found
        # no-cache: the browser revalidates (a 304 costs nothing), so an upgraded daemon's script is seen at once.
        headers = {"ETag": etag, "Cache-Control": "no-cache"}
        if etag in request.headers.get("if-none-match", ""):
            return Response(status_code=304, headers=headers)
        return Response(body, media_type=kind, headers=headers)
