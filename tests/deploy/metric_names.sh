#!/bin/sh
# Every metric name the alert rules, the Prometheus configuration and the Grafana dashboard use
# is one the daemon writes (named in daemon/: metrics.c, or stats.h's list of numbers), so that
# a renamed metric cannot leave a rule or a panel silently empty.  usage: metric_names.sh SOURCE_DIR
set -eu
src=$1
names=$(cat "$src/deploy/alerts.yml" "$src/deploy/prometheus.yml" "$src/deploy/grafana-dashboard.json" |
        grep -oE '\b(gpucd|process)_[a-z0-9_]+' | sed -E 's/_(bucket|sum|count)$//' | sort -u)
[ -n "$names" ] || { echo "no metric names found"; exit 1; }
bad=0
for n in $names; do
  if ! cat "$src"/daemon/*.c "$src"/daemon/*.h | grep -q "\"$n\""; then
    echo "used but never written by the daemon: $n"
    bad=1
  fi
done
[ $bad -eq 0 ] && echo "$(echo "$names" | wc -l) metric names, all written by the daemon"
exit $bad
