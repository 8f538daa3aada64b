// Package simhooks holds the simulation's hooks above NVML: what a
// simulated machine (pkg/nvmlsim) needs beside nvml.Interface for the
// plugin to run on it. That is the time-slicer nvidia-smi would be on real
// GPUs (NVML has no call for time-slices) and the HTTP endpoint through
// which demos and end-to-end tests inject NVML events. Only the composition
// root (pkg/nodeplugin) wires them, and only in simulation.
package simhooks
