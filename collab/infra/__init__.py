"""Database and transport helpers below the models: where Trellis replaces framework behaviour for speed
(docs/infrastructure.md). Nothing here imports collab's models or services."""
