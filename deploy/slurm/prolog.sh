#!/bin/bash
# Slurm Prolog (runs as root on each node before a job): mounts the dataset a job asks for
# with `#SBATCH --comment=loosefs:SOURCE` at /mnt/loosefs/$SLURM_JOB_ID, readable by every user
# (--allow-other; the job sees it as an ordinary directory). Pair with epilog.sh.
# slurm.conf: Prolog=/etc/slurm/loosefs-prolog.sh  Epilog=/etc/slurm/loosefs-epilog.sh
set -euo pipefail
comment=$(scontrol show job "$SLURM_JOB_ID" | sed -n 's/.*Comment=loosefs:\([^ ]*\).*/\1/p')
[ -n "$comment" ] || exit 0
mnt=/mnt/loosefs/$SLURM_JOB_ID
mkdir -p "$mnt"
exec loosefs mount "$comment" "$mnt" --allow-other --log "/var/log/loosefs-$SLURM_JOB_ID.log"
