"""``/docs`` served entirely by the app: Swagger UI's assets (a 5.x build that renders
OpenAPI 3.1) come from the ``fastapi-offline`` package's static files, not a CDN, so the
page renders in a network without internet (where payment back offices run). ReDoc is off:
the contract asks for /docs only."""

from __future__ import annotations

from pathlib import Path

import fastapi_offline
from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.staticfiles import StaticFiles
from starlette.responses import HTMLResponse

ASSETS = "/docs-assets"
STATIC = Path(fastapi_offline.__file__).parent / "static"


def mount_docs(app: FastAPI) -> None:
    """Mount Swagger UI's files and the ``/docs`` page that uses them."""
    app.mount(ASSETS, StaticFiles(directory=str(STATIC)), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json",
            title=f"{app.title} — API",
            swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS}/swagger-ui.css",
            swagger_favicon_url="data:,",
        )
