// Package podattribution finds who uses each prepared ResourceClaim: the
// pods of its status.reservedFor and, from one GET of each pod in the
// background, the containers of those pods that use the claim (and which of
// its requests). The prepare engine records claims as it prepares them and
// turns what this package knows into the holders of device metrics; the
// metrics (pkg/telemetry) receive only those holders.
package podattribution
