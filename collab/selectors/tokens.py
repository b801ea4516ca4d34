"""A user's API tokens as the tokens page and ``GET /api/tokens`` list them."""

from accounts.policy import own_tokens


def tokens_of(user):
    """``user``'s own tokens, newest first (revoked ones too: the page shows them as revoked)."""
    return own_tokens(user).order_by("-created_at")
