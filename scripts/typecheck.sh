#!/usr/bin/env bash
# mypy on the library, as it installs: exactcall/ with activities/, workflows/ and approvals/
# mapped into it (pyproject.toml's package-dir), which mypy cannot follow from the checkout.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/exactcall"
for f in "$root"/exactcall/*; do ln -s "$f" "$tmp/exactcall/"; done
for d in activities workflows approvals; do ln -s "$root/$d" "$tmp/exactcall/$d"; done
cd "$tmp"
"${PYTHON:-$root/.venv/bin/python}" -m mypy -p exactcall --ignore-missing-imports \
  --cache-dir "$tmp/.mypy_cache" "$@"
