from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path, re_path

from config import health
from config.api import api, no_such_route

urlpatterns = [
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("admin/", admin.site.urls),
    path("api/", api.urls),
    re_path(r"^api/", no_such_route),  # after every route: an API path that matches none is a JSON 404
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", include("collab.urls")),
]
