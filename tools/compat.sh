#!/usr/bin/env bash
# Run the full suite on several torch versions, one venv each (kept under .compat/ for reuse).
#
#   tools/compat.sh                 # 2.13.0 and 2.14.1 (both on this machine's disk)
#   tools/compat.sh 2.15.0          # any list of versions; 2.15.0 is a several-GB CUDA build
#
# pip on this machine is capped at torch<=2.14.1 by /etc/xdg/pip; newer versions are installed
# with that config bypassed (PIP_CONFIG_FILE=/dev/null) rather than by editing it.
set -euo pipefail
cd "$(dirname "$0")/.."
versions=("$@")
[ ${#versions[@]} -gt 0 ] || versions=(2.13.0 2.14.1)
status=0
for v in "${versions[@]}"; do
    venv=".compat/torch-$v"
    pip=("$venv/bin/pip")
    # Every install into a newer-than-cap venv bypasses the cap, or pip would downgrade torch.
    if [ "$(printf "%s\n" 2.14.1 "$v" | sort -V | tail -n 1)" != 2.14.1 ]; then pip=(env PIP_CONFIG_FILE=/dev/null "$venv/bin/pip"); fi
    if [ ! -x "$venv/bin/python" ]; then
        python3 -m venv "$venv"
        "${pip[@]}" install --quiet "torch==$v"
    fi
    "${pip[@]}" install --quiet -e ".[test]"
    echo "=== torch $v: $("$venv/bin/python" -c 'import torch; print(torch.__version__)')"
    if "$venv/bin/python" -m pytest -n 2 -q -p no:cacheprovider test; then
        echo "=== torch $v: PASS"
    else
        echo "=== torch $v: FAIL"; status=1
    fi
done
exit $status
