"""The accounts models are registered in ``collab.admin_accounts``: their admin edits go
through collab's services (audit events, sockets closed), and accounts imports nothing
from collab."""
