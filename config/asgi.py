"""ASGI entry point: HTTP through Django, WebSockets through Channels (daphne serves both)."""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

from django.core.asgi import get_asgi_application  # noqa: E402

django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from collab.routing import websocket_urlpatterns  # noqa: E402
from collab.ws_auth import TokenOrSessionAuthMiddlewareStack  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": AllowedHostsOriginValidator(TokenOrSessionAuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)
