"""Tools of the ``collab`` toolset (SPEC §4)."""
