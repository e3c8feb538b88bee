#!/bin/sh
here=$(dirname "$0")
if [ -f "$here/SLOW" ]; then
  echo "slow step started"
  echo $$ > "$here/SLOW.pid"
  exec sleep 120
fi
touch "$1"
