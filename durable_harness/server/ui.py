"""The web viewer's own files: ``GET /ui/`` (``index.html``) and ``GET /ui/assets/<file>``,
served from the package folder ``durable_harness/server/viewer/`` as they are (no build
step). ``/ui`` redirects to ``/ui/``.

They hold no data and need no token: the page asks ``/v1`` for everything, with the
token the user pastes into it (sent as ``Authorization: Bearer``, kept in the tab's
``sessionStorage``; the API accepts a token from that header only, never from a query
string or a cookie, and sends no CORS headers, so a page of another origin can neither
read the API's answers nor make the browser send the token).

Every response under ``/ui`` (its 404s and 405s too) carries :data:`HEADERS`: a
Content-Security-Policy that lets the page load only its own scripts and styles and talk
only to its own origin (so a model reply that carries ``<script>`` or ``onerror=`` runs
nothing even if the page ever failed to escape it), ``nosniff``, no referrer, and no
framing.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.responses import FileResponse, RedirectResponse
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from durable_harness.server.errors import ApiError

#: The page's files, shipped in the wheel (pyproject's package data).
FOLDER = Path(__file__).resolve().parent / "viewer"
PREFIX = "/ui"
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # A new release's page is fetched again, not taken from a cache (ETags keep it cheap).
    "Cache-Control": "no-cache",
}
_RAW_HEADERS = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in HEADERS.items()]

router = APIRouter(include_in_schema=False)


@router.get(PREFIX)
def to_the_page() -> RedirectResponse:
    return RedirectResponse(f"{PREFIX}/", status_code=307)


@router.get(f"{PREFIX}/")
def page() -> FileResponse:
    index = FOLDER / "index.html"
    if not index.is_file():
        raise ApiError(404, "this installation has no viewer page (index.html is missing)")
    return FileResponse(index, media_type="text/html; charset=utf-8")


class ViewerHeaders:
    """ASGI middleware: :data:`HEADERS` on every response to a path under ``/ui``,
    whichever part of the app answered it (a route, the static files, an error handler).
    Pure ASGI, so the API's event streams pass through it untouched."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if path != PREFIX and not path.startswith(f"{PREFIX}/"):
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                ours = {name for name, _ in _RAW_HEADERS}
                kept = [(k, v) for k, v in message.get("headers", []) if k.lower() not in ours]
                message = {**message, "headers": [*kept, *_RAW_HEADERS]}
            await send(message)

        await self.app(scope, receive, with_headers)


def install(app: FastAPI) -> None:
    """Serve the page and its assets on ``app`` (whose server wraps it in
    :class:`ViewerHeaders`, outside every handler, so a 500 carries them too)."""
    app.include_router(router)
    app.mount(f"{PREFIX}/assets", StaticFiles(directory=FOLDER), name="viewer-assets")
