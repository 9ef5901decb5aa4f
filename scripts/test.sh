#!/usr/bin/env bash
# Set up everything the tests need on a fresh machine (or in a fresh virtual environment), then run them.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x /usr/bin/chromium ]; then  # the browser test drives Debian's chromium (never a downloaded browser)
    sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
    { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium; } >/dev/null 2>&1 \
        || echo "test.sh: could not install chromium (apt-get); tests/test_web_console.py will fail until it is" >&2
fi
python -m pip install -q torch==2.13.0            # the local CPU wheel, before anything pulls a CUDA build
python -m pip install -q setuptools wheel         # the dummy plugin packages below build without isolation
python -m pip install -q -e '.[test,cuda,ray]'    # cuda: triton (the kernel tests run in its interpreter); ray: its executor
python -m pip install -q --no-deps --no-build-isolation ./tests/plugins/kc_dummy_*
# KC_REQUIRE_DUMMIES=1: a missing dummy package fails the run. Two phases (tests/conftest.py): every test but the
# `exclusive` ones on KC_TEST_WORKERS pytest-xdist workers (a module's tests on one worker, the longest modules
# first), then the `exclusive` ones alone. Exit code 5 is pytest's "no test selected" (an argument that picks
# none of a phase).
run_phase() {
    local status=0
    KC_REQUIRE_DUMMIES=1 KC_TEST_PHASE="$1" python -m pytest -q -p no:cacheprovider "${@:2}" || status=$?
    [ "$status" = 0 ] || [ "$status" = 5 ] || exit "$status"
}
run_phase parallel -n "${KC_TEST_WORKERS:-2}" --dist loadscope --no-loadscope-reorder "$@"
run_phase exclusive "$@"
