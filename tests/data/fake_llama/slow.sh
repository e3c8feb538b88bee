#!/bin/sh
# Sleeps while the marker file ($2, default SLOW) sits beside this script, after writing its
# pid to MARKER.pid; otherwise touches $1.
here=$(dirname "$0")
marker=${2:-SLOW}
if [ -f "$here/$marker" ]; then
  echo "slow step started"
  echo $$ > "$here/$marker.pid"
  exec sleep 120
fi
touch "$1"
