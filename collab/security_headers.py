"""Security headers for every HTTP answer.

The pages carry no inline script, style or event handler (htmx with ``allowEval``
off; behaviour lives in static/collab/app.js), so the Content-Security-Policy allows
only this origin: scripts, styles, images, fetches and the session socket. The
admin keeps Django's own inline ``style`` attributes. Frames are refused
(``frame-ancestors 'none'`` beside ``X-Frame-Options: DENY``). Nosniff, the
Referrer-Policy and HSTS (when cookies are secure) come from Django's
SecurityMiddleware, configured in settings.
"""

from django.utils.deprecation import MiddlewareMixin

from collab.middleware import OnTheLoop

POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'{admin_styles}; img-src 'self' data:; "
    "font-src 'self'; connect-src 'self' {sockets}; object-src 'none'; base-uri 'none'; "
    "form-action 'self'; frame-ancestors 'none'"
)


def content_security_policy(request) -> str:
    host = request.get_host()
    admin = request.path.startswith("/admin/")
    return POLICY.format(
        admin_styles=" 'unsafe-inline'" if admin else "",
        # 'self' does not cover ws:/wss: in every browser: name this host's sockets explicitly
        sockets=f"ws://{host} wss://{host}",
    )


class ContentSecurityPolicyMiddleware(OnTheLoop, MiddlewareMixin):
    """Sync- and async-capable (``MiddlewareMixin``): an async view holds no thread for it, and
    under ASGI it sets its header on the event loop (``OnTheLoop``)."""

    def process_response(self, request, response):
        response.headers.setdefault("Content-Security-Policy", content_security_policy(request))
        return response
