#!/bin/bash
# Slurm Epilog (root, each node, after a job): unmounts what prolog.sh mounted (detached if a
# straggler still holds a file) and removes the mountpoint. A node whose daemon died is
# unmounted too (loosefs umount handles a stale mount).
mnt=/mnt/loosefs/$SLURM_JOB_ID
[ -d "$mnt" ] || exit 0
loosefs umount --lazy "$mnt" 2>/dev/null || true
rmdir "$mnt" 2>/dev/null || true
exit 0
