"""The LangGraph-compatible API at ``/lg`` (docs/langgraph.md): LangGraph Agent Server routes
over Trellis's own sessions, branches and executions, so ``langgraph-sdk`` clients work.

An agent spec is an *assistant*, a session a *thread*, a user turn a *run*, a message of the
DAG a *checkpoint*. Every route authorizes through ``collab.access`` and calls Trellis's own
services and selectors; this package only translates shapes."""
