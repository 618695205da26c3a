# launch_recover.sh with the host snapshots copied in the background
# (OB_SNAPSHOT_ASYNC=1, the default on CUDA; the CPU default copies on the
# training thread): kill -9 of a host and of a worker mid-run, and every
# step's loss equals an uninterrupted run's.
export OB_SNAPSHOT_ASYNC=1
source "$(dirname "$0")/launch_recover.sh"
