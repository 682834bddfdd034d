#!/usr/bin/env bash
# A single-node Ceph cluster with radosgw on 127.0.0.1: the real S3 server
# Cairn's S3 tests and benchmarks run against. One monitor, one OSD on
# memstore (objects live in RAM: nothing touches the disk, a stop forgets
# everything), radosgw (beast frontend) and an S3 user. From Debian's
# packages: ceph-mon ceph-osd radosgw ceph-common (scripts/install_deps.sh).
#
# Usage: scripts/ceph/ceph.sh COMMAND [--dir DIR] [--port PORT]
#   start      create the cluster in DIR and start it; waits until radosgw
#              answers and the S3 user exists (about 15-30 s). Fails, with the
#              daemon's log tail, when a daemon does not come up. Monitor
#              commands are retried for 10 s, and a failed start is retried
#              twice from scratch. If a cluster of this DIR is already
#              running and healthy, does nothing.
#   start-once one start attempt, without the retries from scratch.
#   stop       stop every daemon of DIR and remove DIR's cluster state.
#   status     exit 0 when radosgw of DIR answers, else 1.
#   env        print the AWS_* settings of the cluster (for eval), and its
#              https endpoint and CA (CAIRN_S3_TLS_ENDPOINT, CAIRN_S3_TLS_CA).
#   kill-rgw   SIGKILL radosgw (fault tests: the S3 server dies mid-request).
#   start-rgw  start radosgw again and wait until it answers.
# DIR defaults to $CAIRN_CEPH_DIR, else /tmp/cairn-ceph-PORT; PORT (radosgw's
# HTTP port) to $CAIRN_CEPH_PORT, else 7480. The monitor listens on
# PORT - 700 (6780 for the default), so clusters of different ports coexist.
# radosgw also serves https on PORT + 1000 with a certificate from a test CA
# made at start (DIR/tls/ca.crt; `env` prints both as CAIRN_S3_TLS_*).
# Credentials: access key "cairn", secret "cairnsecret", region us-east-1.
# Memory: memstore holds every object in RAM (capacity 4 GiB by default,
# CAIRN_CEPH_MEMSTORE_BYTES; the OSD's RSS is about twice the live data);
# deleted objects give their memory back within seconds (radosgw's garbage
# collection runs every 2 s here).
set -euo pipefail

cmd=${1:-}
shift || true
DIR=${CAIRN_CEPH_DIR:-}
PORT=${CAIRN_CEPH_PORT:-7480}
while (($#)); do
  case "$1" in
    --dir) DIR=$2; shift 2 ;;
    --port) PORT=$2; shift 2 ;;
    *) echo "ceph.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
DIR=${DIR:-/tmp/cairn-ceph-$PORT}
MON_PORT=$((PORT - 700))
TLS_PORT=$((PORT + 1000))
MEMSTORE_BYTES=${CAIRN_CEPH_MEMSTORE_BYTES:-$((4 << 30))}
ACCESS_KEY=cairn
SECRET_KEY=cairnsecret
CONF=$DIR/ceph.conf
CEPH=(ceph -c "$CONF" --connect-timeout 10)

die() { echo "ceph.sh: $*" >&2; exit 1; }

# Prints the last lines of a daemon's log (for a failed start).
log_tail() {
  local f=$DIR/log/$1.log
  if [[ -f $f ]]; then
    echo "---- last lines of $f ----" >&2
    tail -n 25 "$f" >&2
  fi
}

need_tools() {
  local t
  for t in ceph-mon ceph-osd radosgw radosgw-admin ceph monmaptool ceph-authtool; do
    command -v "$t" >/dev/null ||
      die "'$t' not found: install Ceph with scripts/install_deps.sh (ceph-mon ceph-osd radosgw ceph-common)"
  done
}

rgw_answers() {
  curl -s -o /dev/null --max-time 2 "http://127.0.0.1:$PORT/" 2>/dev/null
}

# wait_for DESCRIPTION SECONDS LOGNAME COMMAND...: polls COMMAND every 0.5 s.
wait_for() {
  local what=$1 secs=$2 log=$3
  shift 3
  local i
  for ((i = 0; i < secs * 2; i++)); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.5
  done
  log_tail "$log"
  die "$what did not happen within ${secs}s (cluster in $DIR)"
}

# mon_cmd DESCRIPTION ARGS...: runs `ceph ARGS...` against the monitor and
# prints its output. Retried for up to 10 s: on a loaded machine a freshly
# started monitor has refused commands it accepts a moment later (seen in CI:
# "osd crush add" refused, and "Error EPERM: problem getting command
# descriptions from mon" for "osd new"). Both commands are idempotent.
mon_cmd() {
  local what=$1 attempt out err=$DIR/log/mon_cmd.err
  shift
  for attempt in 1 2 3 4 5 6 7 8 9 10; do
    if out=$("${CEPH[@]}" "$@" 2>"$err"); then
      printf '%s\n' "$out"
      return 0
    fi
    sleep 1
  done
  log_tail mon.a
  die "$what failed 10 times; the monitor's last answer: $out$(cat "$err")"
}

pid_alive() {
  local f=$DIR/run/$1.pid
  [[ -f $f ]] && kill -0 "$(cat "$f")" 2>/dev/null
}

write_conf() {
  local fsid=$1
  cat >"$CONF" <<EOF
[global]
fsid = $fsid
mon host = v1:127.0.0.1:$MON_PORT
mon initial members = a
public addr = 127.0.0.1
ms bind msgr2 = false
ms bind ipv4 = true
ms bind ipv6 = false
auth cluster required = none
auth service required = none
auth client required = none
auth supported = none
run dir = $DIR/run
pid file = $DIR/run/\$name.pid
admin socket = $DIR/run/\$name.asok
log file = $DIR/log/\$name.log
mon cluster log file = $DIR/log/cluster.log
log to stderr = false
err to stderr = false
keyring = $DIR/keyring
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
mon allow pool size one = true
mon allow pool delete = true
mon warn on pool no redundancy = false
mon data avail warn = 1
mon data avail crit = 0

[mon]
mon data = $DIR/mon
mon osd full ratio = 0.97
mon osd nearfull ratio = 0.95
mon osd backfillfull ratio = 0.96

[osd]
osd data = $DIR/osd
osd objectstore = memstore
memstore device bytes = $MEMSTORE_BYTES
# The OSD's fullness comes from the bytes its placement groups hold, not from
# memstore's own counter: that counter can go negative under concurrent
# writes and deletes (Ceph 16), which the OSD reads as "-2147483648% full",
# engages its failsafe and drops every write while radosgw keeps accepting
# requests it can never finish (seen in CI).
fake statfs for testing = $MEMSTORE_BYTES
osd op num threads per shard = 2
osd max object size = 1073741824
# The OSD is placed in the CRUSH map by this script, not by itself at start
# (its own placement raced with "osd new" and sometimes failed the start).
osd crush update on start = false
osd class update on start = false

[client.rgw]
rgw frontends = beast endpoint=127.0.0.1:$PORT ssl_endpoint=127.0.0.1:$TLS_PORT ssl_certificate=$DIR/tls/rgw.crt ssl_private_key=$DIR/tls/rgw.key
rgw data = $DIR/rgw
rgw thread pool size = 128
rgw enable usage log = false
rgw dns name = localhost
# Deleted objects' data is garbage-collected within seconds (defaults: after
# 2 hours), so memstore gets its memory back while tests and benchmarks run.
rgw gc obj min wait = 0
rgw gc processor period = 2
rgw gc processor max time = 2
EOF
}

# A test CA and radosgw's certificate (for 127.0.0.1 and localhost), for the
# https endpoint on TLS_PORT.
make_tls() {
  local t=$DIR/tls
  mkdir -p "$t"
  openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj "/CN=Cairn test CA" \
    -keyout "$t/ca.key" -out "$t/ca.crt" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -subj "/CN=localhost" \
    -keyout "$t/rgw.key" -out "$t/rgw.csr" 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' >"$t/san.ext"
  openssl x509 -req -in "$t/rgw.csr" -CA "$t/ca.crt" -CAkey "$t/ca.key" \
    -CAcreateserial -days 30 -extfile "$t/san.ext" -out "$t/rgw.crt" 2>/dev/null ||
    die "openssl could not make radosgw's test certificate"
}

start_mon() {
  ceph-mon -c "$CONF" -i a || { log_tail mon.a; die "ceph-mon did not start"; }
  wait_for "the monitor answering on 127.0.0.1:$MON_PORT" 30 mon.a "${CEPH[@]}" mon stat
}

start_osd() {
  ceph-osd -c "$CONF" -i 0 || { log_tail osd.0; die "ceph-osd did not start"; }
  wait_for "osd.0 coming up" 60 osd.0 bash -c \
    "'${CEPH[0]}' -c '$CONF' --connect-timeout 10 osd dump | grep -q '^osd.0 up'"
}

start_rgw() {
  radosgw -c "$CONF" -n client.rgw || { log_tail client.rgw; die "radosgw did not start"; }
  wait_for "radosgw answering on 127.0.0.1:$PORT" 60 client.rgw rgw_answers
}

do_start() {
  need_tools
  if [[ -f $CONF ]] && pid_alive mon.a && pid_alive osd.0 && pid_alive client.rgw && rgw_answers; then
    echo "ceph.sh: already running in $DIR (radosgw on 127.0.0.1:$PORT)"
    return 0
  fi
  # Anything half-started before is stopped and forgotten.
  do_stop >/dev/null 2>&1 || true
  if ss -ltn 2>/dev/null | grep -qE "127\.0\.0\.1:($PORT|$MON_PORT)\b|\*:($PORT|$MON_PORT)\b"; then
    die "port $PORT or $MON_PORT on 127.0.0.1 is already in use by another process (ss -ltnp); pick another with --port"
  fi
  mkdir -p "$DIR"/{run,log,mon,osd,rgw}
  local fsid osd_uuid
  fsid=$(cat /proc/sys/kernel/random/uuid)
  osd_uuid=$(cat /proc/sys/kernel/random/uuid)
  write_conf "$fsid"
  make_tls

  # Monitor: a monmap with the one v1 address, a keyring (unused with auth
  # none, but mkfs wants one).
  ceph-authtool --create-keyring "$DIR/keyring" --gen-key -n mon. --cap mon 'allow *' >/dev/null
  monmaptool --create --fsid "$fsid" --addv a "[v1:127.0.0.1:$MON_PORT]" "$DIR/monmap" >/dev/null
  ceph-mon -c "$CONF" -i a --mkfs --monmap "$DIR/monmap" --keyring "$DIR/keyring" ||
    { log_tail mon.a; die "ceph-mon --mkfs failed"; }
  start_mon

  # One OSD on memstore.
  local id
  id=$(mon_cmd "osd new" osd new "$osd_uuid")
  [[ $id == 0 ]] || die "expected osd id 0, the monitor gave '$id'"
  mon_cmd "placing osd.0 in the CRUSH map" \
    osd crush add osd.0 1.0 root=default host=localhost >/dev/null
  ceph-osd -c "$CONF" -i 0 --mkfs --osd-uuid "$osd_uuid" >/dev/null 2>&1 ||
    { log_tail osd.0; die "ceph-osd --mkfs failed"; }
  start_osd

  # The S3 user (radosgw-admin creates rgw's pools as needed), then radosgw.
  radosgw-admin -c "$CONF" -n client.rgw user create --uid "$ACCESS_KEY" \
    --display-name "Cairn tests" --access-key "$ACCESS_KEY" \
    --secret-key "$SECRET_KEY" >/dev/null ||
    { log_tail client.rgw; die "radosgw-admin user create failed"; }
  start_rgw
  echo "ceph.sh: radosgw up on http://127.0.0.1:$PORT (cluster in $DIR)"
}

stop_daemon() {
  local name=$1 f=$DIR/run/$1.pid pid i
  [[ -f $f ]] || return 0
  pid=$(cat "$f")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 40; i++)); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.25
    done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$f"
}

do_stop() {
  [[ -d $DIR ]] || return 0
  stop_daemon client.rgw
  stop_daemon osd.0
  stop_daemon mon.a
  # Daemons whose pid file is gone but which still use this DIR's config.
  pkill -KILL -f -- "-c $CONF" 2>/dev/null || true
  rm -rf "$DIR"
  echo "ceph.sh: stopped (removed $DIR)"
}

do_env() {
  cat <<EOF
export AWS_ENDPOINT_URL=http://127.0.0.1:$PORT
export AWS_ACCESS_KEY_ID=$ACCESS_KEY
export AWS_SECRET_ACCESS_KEY=$SECRET_KEY
export AWS_REGION=us-east-1
export CAIRN_S3_TLS_ENDPOINT=https://127.0.0.1:$TLS_PORT
export CAIRN_S3_TLS_CA=$DIR/tls/ca.crt
EOF
}

case "$cmd" in
  start)
    # A start that fails is retried from scratch (a new cluster), twice: the
    # fixture of the S3 tests must not fail a CI run for a monitor's hiccup.
    # Each attempt runs in its own shell, so `die` ends only that attempt.
    for attempt in 1 2 3; do
      if "$0" start-once --dir "$DIR" --port "$PORT"; then exit 0; fi
      [[ $attempt == 3 ]] && die "Ceph did not start in 3 attempts (see above)"
      echo "ceph.sh: start attempt $attempt failed (above); starting again from scratch" >&2
    done
    ;;
  start-once) do_start ;;
  stop) do_stop ;;
  status) rgw_answers ;;
  env) do_env ;;
  kill-rgw)
    f=$DIR/run/client.rgw.pid
    [[ -f $f ]] || die "no radosgw pid file in $DIR/run"
    kill -KILL "$(cat "$f")" 2>/dev/null || true
    rm -f "$f"
    ;;
  start-rgw)
    [[ -f $CONF ]] || die "no cluster in $DIR (run start first)"
    pid_alive client.rgw && rgw_answers || start_rgw
    ;;
  *)
    sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
