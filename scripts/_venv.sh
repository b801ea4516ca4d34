# Sourced by scripts/run and scripts/test: make .venv and install the project into it
# (again only when pyproject.toml changes). Usage: ensure_venv "" | ensure_venv "[dev]"
ensure_venv() {
  local extras="$1" py="${PYTHON:-}"
  if [ -z "$py" ]; then
    for candidate in python3.13 python3.12 python3.11 python3; do
      if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
        py="$candidate"; break
      fi
    done
  fi
  if [ -z "$py" ]; then echo "Trellis needs Python 3.11 or newer (set PYTHON=/path/to/python3)" >&2; exit 1; fi
  if [ ! -x .venv/bin/python ]; then
    echo "Creating .venv with $py …"
    "$py" -m venv .venv
  fi
  local stamp=".venv/.trellis-installed" want
  want="$(cat pyproject.toml | sha256sum | cut -c1-16)$extras"
  if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "Installing Trellis$extras into .venv …"
    .venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip
    .venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".$extras"
    echo "$want" > "$stamp"
  fi
}
