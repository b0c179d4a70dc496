# Sourced by scripts/setup.sh. Observability (issue 17): the dashboard's
# browser test (internal/metrics, TestDashboardInChromium) drives Debian's
# headless chromium through chromedp. tensorboard (its event reader checks
# internal/tblog) is pinned in python/requirements-dev.txt.
if ! command -v chromium >/dev/null; then
  echo "setup: installing chromium (Debian) for the dashboard's browser test"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq chromium >/dev/null
fi
