"""llama.cpp's OpenAI-compatible server (``python -m llama_cpp.server``) with the model loaded
without llama.cpp's extra buffer types (its weight repacking for AMX and AVX-512 kernels).

``manage.py local_model`` runs the server through this module (``python -m
collab.management.llama_server`` plus llama_cpp.server's own arguments). A CPU that has AMX can
still run in a sandbox that does not grant the process AMX tile state (gVisor, where CI runs):
llama.cpp then dies with SIGSEGV on its first ``ldtilecfg``, in the first completion, after the
server has started and answered ``/v1/models`` (seen here). The plain kernels serve a 270M model
fine; llama-cpp-python's server has no option for this, so the default model parameters are
wrapped before it loads the model.
"""

import sys

import llama_cpp.llama_cpp as llama_cpp  # llama.py reads the defaults from this module when it loads
from llama_cpp.server.__main__ import main as serve


def _without_extra_buffer_types() -> None:
    default = llama_cpp.llama_model_default_params

    def params():
        p = default()
        p.use_extra_bufts = False
        return p

    llama_cpp.llama_model_default_params = params


def main() -> None:
    _without_extra_buffer_types()
    sys.argv[0] = "llama_cpp.server"
    serve()


if __name__ == "__main__":
    main()
