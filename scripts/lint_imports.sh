#!/usr/bin/env bash
# The import contracts of pyproject.toml ([tool.importlinter]), checked on the package as it
# installs. import-linter finds modules by walking the package's folder, and kvdeck's
# sub-packages live in folders beside it (package-dir), so it reads a staged copy; it runs
# from there because it puts its working directory on the path (the checkout's kvdeck/
# folder holds only the root module).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-$repo/.venv/bin/python}
site=$(mktemp -d)
trap 'rm -rf "$site"' EXIT
"$python" "$repo/scripts/stage_package.py" "$site" >/dev/null
cd "$site"
PYTHONPATH="$site" "$python" -c "from importlinter.cli import lint_imports_command; lint_imports_command()" \
    --config "$repo/pyproject.toml" --no-cache
