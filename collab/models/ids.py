import secrets

from django.db import models

ID_LENGTH = 12


def new_id() -> str:
    """A short random id (48 bits, lowercase hex) for rows that appear in addresses.

    Random rather than sequential so ids reveal nothing about other tenants'
    volume and cannot be enumerated; unique constraints catch the rare clash.
    """
    return secrets.token_hex(ID_LENGTH // 2)


def id_field(**kwargs):
    return models.CharField(primary_key=True, max_length=ID_LENGTH, default=new_id, editable=False, **kwargs)
