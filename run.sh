#!/usr/bin/env bash
# The two entry points a fresh machine needs: `./run.sh demo` and `./run.sh test`
# (`./run.sh test fast` leaves out the tests that start real processes, and the slow ones).
# Each creates .venv (once) and installs the project into it (again only when
# pyproject.toml, setup.py or the compiled hot path's source changed: the install
# is what builds the extension), so running either twice costs nothing extra.
set -euo pipefail
cd "$(dirname "$0")"

venv=.venv
stamp=$venv/.installed-$(cat pyproject.toml setup.py raftmq/hotpath/_compiled.pyx | sha1sum | cut -c1-12)

bootstrap() {
    if [ ! -x "$venv/bin/python" ]; then
        python3 -m venv "$venv"
    fi
    if [ ! -f "$stamp" ]; then
        "$venv/bin/python" -m pip install --quiet --upgrade pip
        "$venv/bin/python" -m pip install --quiet -e ".[dev,bench,spark]"
        rm -f "$venv"/.installed-*
        touch "$stamp"
    fi
}

cmd=${1:-help}
shift || true
case "$cmd" in
    demo)
        bootstrap
        exec "$venv/bin/python" -m raftmq.tools.broker_demo "$@"
        ;;
    test)
        bootstrap
        "$venv/bin/ruff" check .
        if [ "${1:-}" = fast ]; then
            # everything that starts no real process, but the few slow ones: well under a minute
            shift
            exec "$venv/bin/python" -m pytest -q -m "not processes and not slow" "$@"
        fi
        exec "$venv/bin/python" -m pytest -q "$@"
        ;;
    bench)
        bootstrap
        exec "$venv/bin/python" -m bench "$@"
        ;;
    *)
        echo "usage: ./run.sh demo | test [fast] [pytest args] | bench dledger|broker|spark [--duration S] [--json PATH]" >&2
        exit 2
        ;;
esac
