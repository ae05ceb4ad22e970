#!/usr/bin/env bash
# The two entry points a fresh machine needs: `./run.sh demo` and `./run.sh test`
# (`./run.sh test fast` leaves out the tests that start real processes, and the slow ones).
# Each creates .venv (once) and installs into it what that command needs (again only
# when pyproject.toml, setup.py or the compiled hot path's source changed: the install
# is what builds the extension), so running either twice costs nothing extra: the demo
# needs only the project itself; the tests also need the dev, bench and spark extras
# (pyspark and pyarrow are ~440 MB, so the demo never downloads them).
set -euo pipefail
cd "$(dirname "$0")"

venv=.venv
hash=$(cat pyproject.toml setup.py raftmq/hotpath/_compiled.pyx | sha1sum | cut -c1-12)

# bootstrap NAME EXTRAS: install the project with EXTRAS ("" or "[dev,...]") unless the
# stamp for NAME says this pyproject.toml and extension source were installed already.
# pip's output (what it downloads, with a progress bar on a terminal) shows.
bootstrap() {
    local name=$1 extras=$2
    local stamp=$venv/.installed-$name-$hash
    if [ ! -x "$venv/bin/python" ]; then
        echo "run.sh: creating $venv" >&2
        python3 -m venv "$venv"
    fi
    if [ ! -f "$stamp" ]; then
        echo "run.sh: installing raftmq$extras into $venv (first run only)" >&2
        "$venv/bin/python" -m pip install --quiet --upgrade pip
        "$venv/bin/python" -m pip install --progress-bar on -e ".$extras"
        rm -f "$venv"/.installed-"$name"-*
        touch "$stamp"
    fi
}

# bootstrap_python5: the official RocketMQ 5.x Python client in a venv of its own,
# tests/python5/.venv (its top-level package `rocketmq` is also the C++ client's, which
# the test venv holds), again only when its requirements change.
bootstrap_python5() {
    local dir=tests/python5
    local stamp=$dir/.venv/.installed-$(sha1sum "$dir/requirements.txt" | cut -c1-12)
    if [ ! -f "$stamp" ]; then
        echo "run.sh: installing $dir/requirements.txt into $dir/.venv (first run only)" >&2
        python3 -m venv "$dir/.venv"
        "$dir/.venv/bin/python" -m pip install --quiet -r "$dir/requirements.txt"
        rm -f "$dir"/.venv/.installed-*
        touch "$stamp"
    fi
}

# What the tests need from outside Python; a missing one skips its tests (with the
# reason, shown by -rs) and is named here first. `.ci/run` installs them all (as root).
report_missing_tools() {
    local missing=()
    command -v node >/dev/null || missing+=("node and npm (tests/test_ali_ons.py)")
    [ -f tests/ali_ons/node_modules/ali-ons/package.json ] ||
        missing+=("ali-ons: npm ci in tests/ali_ons (tests/test_ali_ons.py)")
    command -v java >/dev/null || missing+=("Java 17+ (tests/test_spark_source.py)")
    command -v mvn >/dev/null && command -v javac >/dev/null ||
        missing+=("a JDK and Maven (tests/test_java_client.py)")
    command -v strace >/dev/null || missing+=("strace (the jepsen fsync-EIO tests)")
    command -v go >/dev/null || missing+=("Go (tests/test_bench_remoting_pub.py)")
    command -v chromedriver >/dev/null ||
        missing+=("chromium and chromedriver (tests/test_console_browser.py)")
    if [ ${#missing[@]} -gt 0 ]; then
        echo "run.sh: not installed, so their tests will be skipped:" >&2
        printf '  - %s\n' "${missing[@]}" >&2
        echo "  (.ci/run installs them all when run as root on Debian/Ubuntu)" >&2
    fi
}

cmd=${1:-help}
shift || true
case "$cmd" in
    demo)
        bootstrap demo ""
        exec "$venv/bin/python" -m raftmq.tools.broker_demo "$@"
        ;;
    test)
        bootstrap test "[dev,bench,spark]"
        bootstrap_python5
        "$venv/bin/ruff" check .
        report_missing_tools
        # The in-process tests run two at a time (pytest-xdist): most of their time is
        # spent waiting on timers, not on a core. The real-process tests that time
        # nothing (marked untimed) run two at a time, a file's tests on one worker,
        # sharing its fixtures. The other
        # real-process tests run one at a time after them: what they
        # measure (failover gaps, latencies) is part of what they check, and a second
        # test's load would blur it.
        if [ "${1:-}" = fast ]; then
            # everything that starts no real process, but the few slow ones: about 2 minutes
            shift
            exec "$venv/bin/python" -m pytest -q -rs -n 2 -m "not processes and not slow" "$@"
        fi
        # (exit status 5: the arguments chose no test of that tier)
        status=0
        "$venv/bin/python" -m pytest -q -rs -n 2 -m "not processes" "$@" || [ $? = 5 ] || status=1
        "$venv/bin/python" -m pytest -q -rs -n 2 --dist loadfile -m "processes and untimed" "$@" ||
            [ $? = 5 ] || status=1
        "$venv/bin/python" -m pytest -q -rs -m "processes and not untimed" "$@" || [ $? = 5 ] || status=1
        exit $status
        ;;
    bench)
        bootstrap test "[dev,bench,spark]"
        exec "$venv/bin/python" -m bench "$@"
        ;;
    *)
        echo "usage: ./run.sh demo | test [fast] [pytest args] | bench dledger|broker|spark [--duration S] [--json PATH]" >&2
        exit 2
        ;;
esac
