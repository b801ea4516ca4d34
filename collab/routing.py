from django.urls import path

from collab.consumers import SessionConsumer

websocket_urlpatterns = [
    path("ws/sessions/<str:sid>/", SessionConsumer.as_asgi()),
]
