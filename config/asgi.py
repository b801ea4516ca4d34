"""ASGI entry point: HTTP through Django, WebSockets through Channels (daphne serves both), and
the MCP server at ``/mcp`` (``collab.mcp_server``: Streamable HTTP, outside Django's URL stack)."""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

from django.conf import settings  # noqa: E402
from django.core.asgi import get_asgi_application  # noqa: E402

django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from collab.mcp_server import PATHS as MCP_PATHS, mcp_app  # noqa: E402
from collab.routing import websocket_urlpatterns  # noqa: E402
from collab.ws_auth import OriginCheckedStack  # noqa: E402
from collab.infra.request_threads import RequestThreads  # noqa: E402


async def http_app(scope, receive, send):
    """``/mcp`` to the MCP server, everything else to Django."""
    app = mcp_app if scope["path"] in MCP_PATHS else django_asgi_app
    await app(scope, receive, send)


application = ProtocolTypeRouter(
    {
        # TRELLIS_STOCK=request_threads: asgiref's thread per request, as Django's handler makes it
        "http": http_app if "request_threads" in settings.TRELLIS_STOCK else RequestThreads(http_app),
        "websocket": OriginCheckedStack(URLRouter(websocket_urlpatterns)),
    }
)
