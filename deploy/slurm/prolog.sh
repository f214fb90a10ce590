#!/bin/bash
# Slurm Prolog (runs as root on each node before a job): mounts the dataset a job asks for with
# `#SBATCH --comment=loosefs:SOURCE` at /mnt/loosefs/$SLURM_JOB_ID for the job's user alone.
# Root only mounts (`loosefs fuse-fd`); the daemon that reads SOURCE runs as the job's user,
# without privileges, so it reads only what that user may read; the mount belongs to that user
# and no other (no --allow-other: other users of the node, root included, are refused). A
# source the user cannot read is not mounted: said in the job's log below and in slurmd's log,
# and the job runs without it (a prolog failure would drain the node). Pair with epilog.sh.
# slurm.conf: Prolog=/etc/slurm/loosefs-prolog.sh  Epilog=/etc/slurm/loosefs-epilog.sh
#
# Logs: /var/log/loosefs/$SLURM_JOB_ID/ is root's (0755): root writes prolog.log and
# fuse-fd.log there, where no other user can plant a name. The daemon's own log is in the
# user's daemon/ inside it (daemon/daemon.log), which root never opens: the reason a daemon
# gave is read back as the job's user. A process of that user may be on the node already, so
# root never writes, reads or follows a name the user can replace.
#
# Site settings (docs/CLUSTERS.md "Slurm"), in /etc/loosefs/slurm.conf ($LOOSEFS_SLURM_CONF in
# slurmd's environment names another), root's and writable by root alone, `name=value` lines:
#   cache_root=/local/scratch/loosefs   node-local directory of the block caches (default
#                                       /var/cache/loosefs): each user's in <cache_root>/<uid>,
#                                       0700, kept across that user's jobs on this node
#   cache_size=200G                     most bytes a job's daemon keeps there (default: loosefs's)
#   env_file=/etc/loosefs/env/%u.env    the stores' settings and credentials given to the job's
#                                       daemon (%u: the job's user), a root-owned file readable
#                                       by root alone: handed open as /dev/fd/4, so no command
#                                       line, log or other user sees a value
# The job's dataset comes from $SLURM_JOB_COMMENT (slurmd sets it for the prolog); scontrol,
# which Slurm advises prologs not to call, only on a Slurm too old to set it.
set -uo pipefail
if [ -n "${SLURM_JOB_COMMENT+set}" ] || [ -n "${SLURM_SCRIPT_CONTEXT:-}" ]; then
  comment=${SLURM_JOB_COMMENT:-}
  case "$comment" in loosefs:*) comment=${comment#loosefs:}; comment=${comment%% *} ;; *) comment= ;; esac
else
  comment=$(scontrol show job "$SLURM_JOB_ID" | sed -n 's/.*Comment=loosefs:\([^ ]*\).*/\1/p')
fi
[ -n "$comment" ] || exit 0
user=${SLURM_JOB_USER:?the prolog runs under slurmd, which sets SLURM_JOB_USER}
uid=${SLURM_JOB_UID:-$(id -u "$user")}
gid=${SLURM_JOB_GID:-$(id -g "$user")}
bin=$(command -v loosefs) || { echo "prolog.sh: slurmd's PATH has no loosefs" >&2; exit 0; }
case "$SLURM_JOB_ID" in
  ''|*[!0-9_]*) echo "prolog.sh: job id $SLURM_JOB_ID is not a number: not mounted" >&2; exit 0 ;;
esac
# The log root is root's and no one else may write it (else every name below it is theirs).
root_logs=/var/log/loosefs
umask 022
mkdir -p "$root_logs"
if [ -L "$root_logs" ] || [ "$(stat -c %u:%a "$root_logs")" != 0:755 ]; then
  chown 0:0 "$root_logs" 2>/dev/null; chmod 0755 "$root_logs" 2>/dev/null
  if [ -L "$root_logs" ] || [ "$(stat -c %u:%a "$root_logs")" != 0:755 ]; then
    echo "prolog.sh: $root_logs is not a root-owned 0755 directory: not mounted" >&2
    exit 0
  fi
fi
logs=$root_logs/$SLURM_JOB_ID
# A directory left by an earlier job with this id (a cluster whose ids restarted) is set
# aside, never reused: whatever it holds may be another user's.
if [ -e "$logs" ] || [ -L "$logs" ]; then
  mv -T -- "$logs" "$logs.before-$(date +%s%N)" || { echo "prolog.sh: cannot set $logs aside" >&2; exit 0; }
fi
mkdir -m 0755 "$logs" || { echo "prolog.sh: cannot make $logs" >&2; exit 0; }
mkdir -m 0700 "$logs/daemon" && chown "$uid:$gid" "$logs/daemon" \
  || { echo "prolog.sh: cannot make $logs/daemon" >&2; exit 0; }
# Both of root's logs are made here, in root's directory, before anything runs as the user.
: >"$logs/prolog.log" && : >"$logs/fuse-fd.log" && chmod 0644 "$logs/prolog.log" "$logs/fuse-fd.log"
say() { echo "prolog.sh: job $SLURM_JOB_ID ($user): $*" | tee -a "$logs/prolog.log" >&2; }
# The job's user, as login would make them (groups, HOME and USER from passwd).
as_user=(setpriv --reuid="$uid" --regid="$gid" --init-groups --reset-env)
case "$comment" in
  *://*) ;;  # a URL: the daemon reaches it with the user's own credentials (~/.aws, ...)
  *)
    if ! "${as_user[@]}" test -r "$comment"; then
      say "$comment: not readable by $user: not mounted"
      exit 0
    fi ;;
esac
# Whether $1 is a directory (not a link) owned by root, with no symbolic link on its path, and
# that no one else may write: a file root may then trust, and create names in.
roots_own() {
  [ ! -L "$1" ] && [ "$(stat -c %u:%F -- "$1" 2>/dev/null)" = "0:${2:-directory}" ] \
    && [ "$(realpath -e -- "$1" 2>/dev/null)" = "$1" ] && [ -z "$(find "$1" -maxdepth 0 -perm /022)" ]
}
conf=${LOOSEFS_SLURM_CONF:-/etc/loosefs/slurm.conf}
cache_root=/var/cache/loosefs cache_size= env_file=
if [ -e "$conf" ]; then
  if roots_own "$conf" "regular file"; then
    while IFS='=' read -r name value; do
      case "$name" in
        cache_root) cache_root=$value ;;
        cache_size) cache_size=$value ;;
        env_file) env_file=${value//%u/$user} ;;
      esac
    done <"$conf"
  else
    say "$conf is not a root-owned file only root may write: its settings are not used"
  fi
fi
# The user's block cache on this node's own disk: <cache_root>/<uid>, made by root in its own
# directory (no other user can plant a name there), then given to the user.
daemon_cache=()
[ -d "$cache_root" ] || mkdir -m 0755 -- "$cache_root" 2>/dev/null
if roots_own "$cache_root"; then
  cache=$cache_root/$uid
  if [ -e "$cache" ] || [ -L "$cache" ]; then
    if [ -L "$cache" ] || [ "$(stat -c %u:%F -- "$cache")" != "$uid:directory" ]; then
      mv -T -- "$cache" "$cache.before-$(date +%s%N)" || cache=
    fi
  fi
  if [ -n "$cache" ] && [ ! -e "$cache" ]; then
    mkdir -m 0700 -- "$cache" && chown "$uid:$gid" -- "$cache" || cache=
  fi
  if [ -n "$cache" ]; then
    daemon_cache=(--cache-dir "$cache")
    [ -z "$cache_size" ] || daemon_cache+=(--cache-size "$cache_size")
  else
    say "cannot make $cache_root/$uid: the daemon caches in its user's default place"
  fi
else
  say "$cache_root is not a root-owned directory only root may write: the daemon caches in its user's default place"
fi
# The site's credentials for this user, opened by root from root's file, read by the daemon
# from the descriptor.
daemon_env=()
if [ -n "$env_file" ]; then
  if roots_own "$env_file" "regular file" && [ -z "$(find "$env_file" -maxdepth 0 -perm /044)" ]; then
    daemon_env=(--env-file /dev/fd/4)
  elif [ -e "$env_file" ]; then
    say "$env_file is not a root-owned file only root may read: not given to the daemon"
  fi
fi
[ ${#daemon_env[@]} -gt 0 ] || env_file=/dev/null
mnt=/mnt/loosefs/$SLURM_JOB_ID
mkdir -p "$mnt"
# fuse-fd mounts (root), hands the connection to the daemon as the user, and stays until the
# mount ends (the epilog's unmount ends it); setsid keeps both out of the prolog's session.
# With --keeper the process fuse-fd waits for is the mount's keeper: a daemon that dies (a
# crash, the OOM killer) is started again on the same connection, the reads in flight resent.
setsid "$bin" fuse-fd "$mnt" --owner "$uid" -- "${as_user[@]}" "$bin" mount "$comment" /dev/fd/3 \
  --foreground --keeper --log "$logs/daemon/daemon.log" "${daemon_cache[@]}" "${daemon_env[@]}" \
  </dev/null 4<"$env_file" >>"$logs/fuse-fd.log" 2>&1 &
fuse_fd=$!
# Ready once mounted and the daemon answers the user's statfs (which waits for the daemon's
# FUSE_INIT). A daemon that gives up ends fuse-fd, which unmounts: then no wait is left.
is_mounted() { [ "$(findmnt -n -o FSTYPE --mountpoint "$mnt")" = fuse.loosefs ]; }
deadline=$((SECONDS + 120))
until { is_mounted && "${as_user[@]}" timeout 120 stat -f "$mnt" >/dev/null 2>&1; } \
  || ! kill -0 "$fuse_fd" 2>/dev/null || [ "$SECONDS" -ge "$deadline" ]; do
  sleep 0.1
done
if ! is_mounted; then
  # Why, in one line: the last lines of root's fuse-fd.log, and of the daemon's log read as
  # the job's user (root never reads a name that user controls).
  why=$( { tail -n 3 -- "$logs/fuse-fd.log"
           "${as_user[@]}" tail -n 3 -- "$logs/daemon/daemon.log"; } 2>/dev/null | tr '\n' ' ')
  say "$comment: the daemon did not start: ${why:-no message (see $logs)}"
  rmdir "$mnt" 2>/dev/null
fi
exit 0
