from collab.models import Event

PAGE = 500


def events_after(session_id: str, after: int = 0, limit: int = PAGE) -> list[Event]:
    """A session's events with ``seq > after``, ascending. Callers authorize the session first."""
    return list(Event.objects.filter(session_id=session_id, seq__gt=after).order_by("seq")[:limit])
