// Package sharing applies a sharing strategy (time-slicing or MPS) to a GPU
// or MIG device when its first share is prepared, and undoes it after its
// last share is unprepared.
//
// The prepare path calls a manager for every shared device of a claim while
// it holds that GPU's lock: Acquire when it prepares a share, Release when it
// unprepares one, and Reconcile once after a restart with every share its
// checkpoint still holds. Acquire and Release are idempotent, so a preparation
// interrupted by a crash is undone by calling Release again. Each manager
// keeps one small state file per device under a directory the caller gives
// it: the shares it counts, the settings it applied and what to restore, so a
// restarted plugin finds and restores them.
//
//   - TimeSlicingManager sets the GPU's compute mode to DEFAULT (when it is
//     EXCLUSIVE_PROCESS) and its time-slice level through a TimeSlicer
//     (nvidia-smi compute-policy on a node, the simulation in tests), and
//     restores both after the last share.
//   - MPSManager runs one nvidia-cuda-mps-control daemon per device through a
//     DaemonLauncher (a process of the plugin, or a pod of its own with
//     pkg/mpspod, which outlives the plugin's container), and returns the
//     container edits (environment, bind mounts of the pipe directory and,
//     with ShmSize, of the device's /dev/shm tmpfs) that connect a share's
//     containers to it with the share's limits.
//
// docs/sharing.md describes the behaviour, the rules for conflicting
// settings and the failure handling.
package sharing
