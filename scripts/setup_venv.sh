#!/usr/bin/env bash
# Creates (or brings up to date) the project's Python virtual environment .venv at the repository
# root: the analysis package `draftscope` installed editable, with pytest and what executing the
# example notebook needs (nbclient, nbformat, ipykernel). Idempotent and quick when nothing changed:
# a stamp file records the hash of analysis/pyproject.toml and of this script; a matching stamp
# and every package present skip everything.
#
# Usage: scripts/setup_venv.sh            (PYTHON=python3.11 to pick the interpreter)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv="$root/.venv"
stamp="$venv/.draftscope-stamp"
py=${PYTHON:-python3}

want=$(cat "$root/analysis/pyproject.toml" "$0" | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] &&
   "$venv/bin/python" -c 'import importlib.util as u, sys
sys.exit(any(u.find_spec(m) is None for m in
             ("draftscope", "pytest", "nbclient", "ipykernel", "h5py", "pandas", "matplotlib")))' \
       2>/dev/null; then
    echo "setup_venv: .venv up to date"
    exit 0
fi

if ! "$py" -c 'import venv, ensurepip' 2>/dev/null; then
    echo "setup_venv: $py lacks the venv/ensurepip modules (Debian: apt-get install python3-venv)" >&2
    exit 1
fi
if [ ! -x "$venv/bin/python" ]; then
    echo "setup_venv: creating $venv"
    "$py" -m venv "$venv"
fi
echo "setup_venv: installing the analysis package and its test tools into .venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip
"$venv/bin/python" -m pip install -q --disable-pip-version-check -e "$root/analysis[test]"
# The notebook test runs the kernel "python3" from this environment: register it inside the venv
# (never in the user's own Jupyter directories).
"$venv/bin/python" -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (draftscope)" >/dev/null
echo "$want" > "$stamp"
echo "setup_venv: .venv ready"
