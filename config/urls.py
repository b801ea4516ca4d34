from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.http import HttpResponseRedirect
from django.templatetags.static import static
from django.urls import include, path

from collab import health
from config.api import api
from config.lg import lg_api


async def favicon(request):
    """Browsers ask for ``/favicon.ico`` whatever the page links: sent to the SVG one, not a 404."""
    response = HttpResponseRedirect(static("collab/favicon.svg"))
    response["Cache-Control"] = "public, max-age=86400"
    return response


urlpatterns = [
    path("favicon.ico", favicon, name="favicon"),
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("admin/", admin.site.urls),
    path("api/", api.urls),  # a path under /api/ or /lg/ that no route matches: a JSON 404
    path("lg/", lg_api.urls),  # (collab.middleware.ApiErrorShapeMiddleware); /lg: docs/langgraph.md
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", include("collab.urls")),
]
