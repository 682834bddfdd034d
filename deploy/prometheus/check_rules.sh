#!/bin/sh
# Checks the example alerting rules: `promtool check rules` on
# cairn-alerts.yaml, then its unit tests (`promtool test rules
# cairn-alerts-test.yaml`). Run as the ctest prometheus_rules_test.
#   deploy/prometheus/check_rules.sh [--promtool=PATH]
set -eu
promtool=/usr/bin/promtool
for arg in "$@"; do
  case "$arg" in
    --promtool=*) promtool=${arg#--promtool=} ;;
    *) echo "check_rules: unknown argument $arg" >&2; exit 2 ;;
  esac
done
if [ ! -x "$promtool" ]; then
  echo "check_rules: $promtool is missing: install Debian's prometheus" \
    "package (scripts/install_deps.sh)" >&2
  exit 1
fi
cd "$(dirname "$0")"
"$promtool" check rules cairn-alerts.yaml
"$promtool" test rules cairn-alerts-test.yaml
