"""Rows made into model instances without running ``Model.__init__`` for each (toward ≥ 100
turns/s with two workers).

Django makes every row it loads an instance through ``Model.from_db``, which calls
``cls(*values)``: ``__init__`` sends ``pre_init`` and ``post_init`` and assigns each column through
its field's descriptor (``setattr``), ~30 µs a wide row here. A turn loads ~17 such rows in the
worker (the job, its project, session, branch, spec and prompt, then each again under its lock)
and about as many in the web process: ~12 % of the worker's CPU (cProfile, ``bench/turn_cpu.py``).

``FastLoad.from_db`` — Django's documented hook for customizing how a model is loaded — makes
the same instance directly when doing so cannot differ from ``__init__``:

- every column is loaded (no deferred fields), in the order of the model's concrete fields,
  which is when ``Model.from_db`` passes them to ``__init__`` positionally;
- each column's attribute is a plain ``DeferredAttribute`` (or a foreign key's, whose ``__set__``
  only forgets a cached related object, which a new instance has none of), so assigning it
  through the descriptor and putting it in the instance's ``__dict__`` are the same;
- nothing listens to ``pre_init`` or ``post_init`` for the model (checked at each load: a
  receiver connected later is honoured).

Otherwise — and everywhere with ``TRELLIS_STOCK=fast_load`` — it is ``Model.from_db``, unchanged.
"""

from django.conf import settings
from django.db.models.base import ModelState
from django.db.models.fields.related_descriptors import ForeignKeyDeferredAttribute
from django.db.models.query_utils import DeferredAttribute
from django.db.models.signals import post_init, pre_init

PLAIN_DESCRIPTORS = (DeferredAttribute, ForeignKeyDeferredAttribute)
_NAMES = "_fast_load_names"


class FastLoad:
    """A mixin for a model (before ``models.Model`` among its bases)."""

    @classmethod
    def from_db(cls, db, field_names, values):
        names = cls.__dict__.get(_NAMES)  # the class's own: a subclass decides for itself
        if names is None:
            names = _plain_attnames(cls)
            setattr(cls, _NAMES, names)
        if (not names or len(values) != len(names) or "fast_load" in settings.TRELLIS_STOCK
                or pre_init.has_listeners(cls) or post_init.has_listeners(cls)):
            return super().from_db(db, field_names, values)
        instance = cls.__new__(cls)
        instance.__dict__.update(zip(names, values))
        state = instance._state = ModelState()
        state.adding = False
        state.db = db
        return instance


def _plain_attnames(model) -> tuple:
    """The attribute names of the model's concrete fields in order, or () if one of them is read
    or written through a descriptor of its own (a file field's, say)."""
    names = []
    for field in model._meta.concrete_fields:
        descriptor = next((klass.__dict__[field.attname] for klass in model.__mro__ if field.attname in klass.__dict__),
                          None)
        if type(descriptor) not in PLAIN_DESCRIPTORS:
            return ()
        names.append(field.attname)
    return tuple(names)
