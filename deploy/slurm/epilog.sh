#!/bin/bash
# Slurm Epilog (root, each node, after a job): unmounts what prolog.sh mounted (detached if a
# straggler still holds a file), which ends the job's daemon and its fuse-fd, and removes the
# mountpoint. A node whose daemon died is unmounted too (loosefs umount handles a stale mount).
# The mount is the job user's alone: root cannot even stat it, so it is found in the mount table.
# The job's logs stay in /var/log/loosefs/$SLURM_JOB_ID/ (root's) and its daemon/ (the user's).
mnt=/mnt/loosefs/$SLURM_JOB_ID
if findmnt --mountpoint "$mnt" >/dev/null 2>&1; then
  loosefs umount --lazy "$mnt" 2>/dev/null || true
fi
rmdir "$mnt" 2>/dev/null || true
exit 0
