// Package nvmlsim simulates whole NVIDIA machines behind nvml.Interface, for demos and tests only.
//
// It is the project's only fake. Everything above it (discovery, MIG lifecycle, health) is
// production code that calls standard NVML methods, so the simulation aims to answer those calls
// the way the hardware does: real GPU names, memory sizes, PCI bus IDs, NUMA placement and NVLink
// topology of DGX A100, H100, H200 and B200 systems and of a four-L4 PCIe server; the MIG
// GPU-instance and compute-instance profile tables that `nvidia-smi mig -lgip` / `-lgipp` print on
// those GPUs (see profiles.go, which also corrects the tables of go-nvml's own mock machines);
// placement and capacity enforcement; NVML's return codes for misuse; events; and state that
// survives a process restart like hardware state does (WithStateFile).
//
// A Machine is built on go-nvml's moq-generated mocks (mock.Interface, mock.Device,
// mock.GpuInstance, mock.ComputeInstance, mock.EventSet) and reads the driver, NVML and CUDA
// versions from go-nvml's mock servers (mock/dgxa100, dgxh100, dgxh200, dgxb200). NVML methods the
// simulation does not model return nvml.ERROR_NOT_SUPPORTED instead of panicking, as a GPU lacking
// a feature would. The exceptions are methods whose go-nvml signature returns a "handler" struct
// (GetGpuInstanceProfileInfoV, GetComputeInstanceProfileInfoV, GetGpuFabricInfoV, GetTemperatureV,
// GetNvLinkInfo, GetC2cModeInfoV, GetGpuInstanceProfileInfoByIdV): those handlers call
// libnvidia-ml directly and cannot be simulated, so they panic with a message naming the
// equivalent plain method (GetGpuInstanceProfileInfo, GetGpuFabricInfo, ...), which production
// code should call instead.
//
// Like real NVML, every call other than Init fails with nvml.ERROR_UNINITIALIZED until Init has
// been called, and after the matching Shutdown.
//
// Tests can inject failures (InjectError), deliver events such as XIDs (InjectEvent), mark a GPU
// as fallen off the bus (SetGPULost), inspect MIG state (GpuInstances), and generate a sysfs tree
// (WriteSysfs) and a driver root with device nodes, libraries and an nvidia-smi script
// (WriteDriverRoot) so that containers really receive devices. The sysfs tree has PCI driver
// binding and IOMMU groups; ServeSysfs binds and unbinds GPUs when bind and unbind are written,
// and a GPU bound to vfio-pci leaves NVML until it is bound to nvidia again (pcibind.go). Simulated processes (the load
// program of pkg/nvmlsim/loadsim, through ServeProcesses, or RegisterProcess) make NVML list running
// processes, MPS clients, per-process utilization samples and GPM metrics, and drive the
// device-wide utilization and used memory (processes.go, gpm.go).
package nvmlsim
