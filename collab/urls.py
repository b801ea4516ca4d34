from django.urls import path

from collab import views

app_name = "collab"

urlpatterns = [
    path("", views.projects, name="projects"),
    path("projects/new", views.new_project, name="new_project"),
    path("search", views.search, name="search"),
    path("inbox", views.inbox, name="inbox"),
    path("inbox/count", views.needs_you, name="needs_you"),
    path("inbox/<str:item_id>", views.decide_item, name="decide_item"),
    path("p/<slug:slug>/", views.project, name="project"),
    path("invitations/<int:invitation_id>/accept", views.answer_invitation, {"answer": "accept"}, name="accept_invitation"),
    path("invitations/<int:invitation_id>/decline", views.answer_invitation, {"answer": "decline"}, name="decline_invitation"),
    path("p/<slug:slug>/sessions", views.new_session, name="new_session"),
    path("p/<slug:slug>/limits", views.project_limits, name="project_limits"),
    path("p/<slug:slug>/members", views.project_members, name="project_members"),
    path("p/<slug:slug>/audit", views.audit, name="audit"),
    path("p/<slug:slug>/settings", views.project_settings, name="project_settings"),
    path("p/<slug:slug>/webhooks", views.project_webhooks, name="project_webhooks"),
    path("p/<slug:slug>/specs", views.specs, name="specs"),
    path("p/<slug:slug>/specs/<str:agent_id>", views.spec, name="spec"),
    path("s/<str:sid>/holds/<int:hold_id>", views.decide_hold, name="decide_hold"),
    path("account/tokens", views.tokens, name="tokens"),
    path("account/tokens/<int:token_id>/revoke", views.revoke_token_view, name="revoke_token"),
    path("s/<str:sid>/", views.session, name="session"),
    *[
        path(f"s/<str:sid>/{part}", views.session_partial, {"part": part}, name=f"session_{part}")
        for part in sorted(views.SESSION_PARTIALS)
    ],
    path("s/<str:sid>/dag", views.session_dag, name="session_dag"),
    path("s/<str:sid>/rows", views.session_rows, name="session_rows"),
    path("s/<str:sid>/running", views.session_running, name="session_running"),
    path("s/<str:sid>/m/<str:mid>/row", views.message_row, name="message_row"),
    path("s/<str:sid>/jobs/<str:job_id>", views.job_row, name="job_row"),
    path("s/<str:sid>/branches/<str:branch_id>", views.branch_row, name="branch_row"),
    path("s/<str:sid>/agents/<str:child_sid>", views.agent_row, name="agent_row"),
    path("s/<str:sid>/turns", views.post_turn, name="post_turn"),
    path("s/<str:sid>/visibility", views.session_visibility, name="session_visibility"),
    path("s/<str:sid>/m/<str:mid>/fork", views.fork, name="fork"),
    path("s/<str:sid>/jobs/<str:job_id>/cancel", views.cancel_job, name="cancel_job"),
    path("s/<str:sid>/b/<str:branch_id>/archive", views.archive_branch, name="archive_branch"),
]
