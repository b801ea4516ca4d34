"""Reading the operator's settings from the environment: values, model connections and webhook hosts
(docs/operations.md). Imported by config.settings before Django is set up: no models here."""
