#!/usr/bin/env bash
# Starts a single-node Slurm cluster on this machine for the Slurm tests.
#
#   bash .ci/slurm-up.sh        (as root; idempotent)
#
# Installs Debian's slurm-wlm and munge if they are missing, writes a minimal
# slurm.conf for this host (no cgroups: processes are tracked through /proc,
# so it runs in a container too), starts munged, slurmctld and slurmd, and
# waits until `srun -n2 hostname` runs. When Slurm already answers, it does
# nothing. Exits non-zero, saying why, when Slurm cannot be started; the log
# files are in /var/log/slurm.
set -euo pipefail

host=$(hostname -s)
cpus=$(nproc)
conf_dir=/etc/slurm
conf=$conf_dir/slurm.conf
log_dir=/var/log/slurm
# Seconds to wait for the daemons to answer.
wait_seconds=${SLURM_UP_WAIT:-60}

say() { echo "slurm-up: $*"; }
fail() { echo "slurm-up: $*" >&2; exit 1; }

srun_works() {
  command -v srun >/dev/null 2>&1 &&
    [ "$(timeout 20 srun -n2 hostname 2>/dev/null | wc -l)" = 2 ]
}

# slurm.conf: one node (this host, all its CPUs), one partition, no
# accounting, no cgroups. Rewritten only when it changes. cred_expire (120 s
# by default) is also how long a requeued job waits before it starts again:
# 30 s keeps the requeue tests short and is ample on one node.
wanted=$(cat <<EOF
# Written by multigpu's .ci/slurm-up.sh: a single-node cluster for tests.
ClusterName=multigpu
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldLogFile=$log_dir/slurmctld.log
SlurmdLogFile=$log_dir/slurmd.log
KillWait=5
AuthInfo=cred_expire=30
NodeName=$host CPUs=$cpus State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
EOF
)
if srun_works && [ -f "$conf" ] && [ "$(cat "$conf")" = "$wanted" ]; then
  say "Slurm is up (srun -n2 hostname works)"
  exit 0
fi

[ "$(id -u)" = 0 ] || fail "needs root to install and start Slurm (running as uid $(id -u))"

if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null ||
   ! command -v srun >/dev/null || ! command -v munged >/dev/null; then
  command -v apt-get >/dev/null || fail "no apt-get: install slurm-wlm and munge by hand"
  say "installing slurm-wlm and munge from Debian"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq || fail "apt-get update failed"
  # Without systemd the packages' service starts fail harmlessly; this
  # script starts the daemons itself.
  apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null ||
    fail "apt-get install slurm-wlm munge failed"
fi

# slurmctld, slurmd and the TensorFlow workers (whose addresses are the node
# names) all need this host's name to resolve; some containers lack that.
if ! getent hosts "$host" >/dev/null; then
  say "adding $host to /etc/hosts (127.0.0.1): its name does not resolve"
  echo "127.0.0.1 $host" >> /etc/hosts
fi

# munge: a key, its directories, and the daemon (run as its own user, as
# Debian's service does).
mkdir -p /etc/munge /var/lib/munge /var/log/munge /run/munge
if [ ! -s /etc/munge/munge.key ]; then
  if command -v mungekey >/dev/null; then
    mungekey --create --keyfile=/etc/munge/munge.key
  else
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
  fi
fi
chown -R munge:munge /etc/munge /var/lib/munge /var/log/munge /run/munge
chmod 0700 /etc/munge /var/lib/munge /var/log/munge
chmod 0755 /run/munge
chmod 0400 /etc/munge/munge.key
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  say "starting munged"
  runuser -u munge -- /usr/sbin/munged
  for _ in $(seq 1 50); do
    munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break
    sleep 0.1
  done
  munge -n | unmunge >/dev/null || fail "munged does not answer (see /var/log/munge)"
fi

mkdir -p "$conf_dir" "$log_dir" /var/spool/slurmctld /var/spool/slurmd
restart=0
if [ ! -f "$conf" ] || [ "$(cat "$conf")" != "$wanted" ]; then
  say "writing $conf (NodeName=$host CPUs=$cpus)"
  printf '%s\n' "$wanted" > "$conf"
  restart=1
fi

running() { pgrep -x "$1" >/dev/null; }
stop() {
  local pidfile=/run/$1.pid
  if [ -f "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null; then
    for _ in $(seq 1 50); do running "$1" || break; sleep 0.1; done
  fi
}
if [ "$restart" = 1 ]; then
  stop slurmd
  stop slurmctld
fi
if ! running slurmctld; then
  say "starting slurmctld"
  slurmctld -i
fi
if ! running slurmd; then
  say "starting slurmd"
  slurmd
fi

say "waiting for srun -n2 hostname"
deadline=$((SECONDS + wait_seconds))
until srun_works; do
  if [ "$SECONDS" -ge "$deadline" ]; then
    sinfo -N -l >&2 || true
    tail -n 20 "$log_dir/slurmctld.log" "$log_dir/slurmd.log" >&2 || true
    fail "srun -n2 hostname did not run within ${wait_seconds} s"
  fi
  # A node that was down before its slurmd came back returns on its own
  # (ReturnToService=2); resume it in case it was drained.
  scontrol update nodename="$host" state=resume >/dev/null 2>&1 || true
  sleep 1
done
say "Slurm is up: node $host, $cpus CPUs"
