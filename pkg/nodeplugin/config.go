// Package app runs the kubelet plugin: it wires NVML, discovery, the device
// model, the prepare path and the kubelet helper together. The command in
// cmd/dra-kubelet-plugin only parses flags into a Config and calls Run.
package nodeplugin

import (
	"fmt"
	"io"
	"net"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/spf13/pflag"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/client-go/kubernetes"

	"github.com/gpu-dra/gpu-dra-driver/pkg/health"
	"github.com/gpu-dra/gpu-dra-driver/pkg/heartbeat"
	"github.com/gpu-dra/gpu-dra-driver/pkg/kubeclient"
	"github.com/gpu-dra/gpu-dra-driver/pkg/liveness"
	"github.com/gpu-dra/gpu-dra-driver/pkg/nvmlsim"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// Config is everything the plugin needs to run.
type Config struct {
	DriverName string
	NodeName   string
	// DeviceMetadata enables the kubelet plugin helper's device metadata
	// files (KEP-5304) for every prepared device.
	DeviceMetadata bool

	// The API client's --kubeconfig, --kube-api-qps and --kube-api-burst.
	kubeclient.Options

	// PluginDataDir holds the plugin's socket, checkpoint and, in
	// simulation, the simulated machine's state.
	PluginDataDir string
	RegistrarDir  string
	// CDIDir is where transient per-claim CDI specs are written.
	CDIDir string
	// DriverRoot is where the plugin finds the NVIDIA driver's device
	// nodes, libraries and binaries ("/" on a plain node); HostDriverRoot
	// is the same directory as the host sees it, named in CDI specs (empty:
	// DriverRoot). They differ when a plugin container mounts the host's
	// driver root elsewhere, e.g. a host-installed driver at /driver-root.
	DriverRoot      string
	HostDriverRoot  string
	SysfsRoot       string
	NVMLLibraryPath string

	// DevicePolicyFile restricts what each GPU publishes (MIG, shares).
	DevicePolicyFile string

	// MPSDir holds the MPS daemons' pipe and log directories (≤ 60 bytes:
	// unix sockets live below it). MPSControl overrides the control program.
	MPSDir     string
	MPSControl string
	// MPSDaemonImage, when set, runs the MPS control daemons as pods of
	// this image on the node (owned by the plugin pod's DaemonSet), so
	// that they survive the plugin's container; MPSDaemonPriorityClass is
	// their priority class and MPSDaemonServiceAccount their service
	// account. PodName and PodNamespace name the plugin's pod.
	MPSDaemonImage          string
	MPSDaemonPriorityClass  string
	MPSDaemonServiceAccount string
	// MPSDaemonDisruptionBudget names the PodDisruptionBudget in
	// PodNamespace that controls the daemon pods, so that kubectl drain
	// takes them without --force and never evicts them (pkg/mpspod).
	MPSDaemonDisruptionBudget string
	// MPSShmSize is the size of the tmpfs each MPS device's daemon pod and
	// clients share as /dev/shm, e.g. "1Gi"; empty or "0": none.
	MPSShmSize   string
	PodName      string
	PodNamespace string
	// PodUID is the plugin pod's UID (downward API). Set, the plugin runs
	// for rolling upgrades: its sockets carry the UID, and a newer instance
	// serves beside it while the node is handed over (pkg/handover).
	PodUID string

	// Health: XIDs that change nothing, quiet time before a GPU is healthy
	// again, taint effects per reason; MetricsAddress serves /metrics,
	// guarded as MetricsAuth says (MetricsAuthNone, also when empty, or
	// MetricsAuthDelegated),
	// over HTTPS with MetricsCertFile and MetricsKeyFile when given.
	IgnoredXIDs          string
	HealthRecoveryWindow time.Duration
	HealthTaintEffects   string
	MetricsAddress       string
	MetricsAuth          string
	MetricsCertFile      string
	MetricsKeyFile       string
	// LocalMetricsAddress, a loopback address, serves the same /metrics
	// without authentication inside the plugin's pod only: `kubectl gpu
	// top` reaches it through the API server's pods/portforward, which the
	// API server authorizes (docs/telemetry.md). Empty disables it.
	LocalMetricsAddress string
	// DCGMMetrics adds dcgm-exporter's metric and label names to /metrics
	// (docs/telemetry.md, "dcgm-exporter compatibility").
	DCGMMetrics bool

	// ProbeAddress serves the kubelet's /readyz and /livez probes (plain
	// HTTP, no credentials; empty: off). Checks of the DRA and registration
	// sockets, of NVML and of the engine run every ProbePeriod, each bounded by
	// ProbeTimeout; /livez fails after LivenessFailureThreshold
	// consecutive failed rounds (pkg/liveness).
	ProbeAddress             string
	ProbePeriod              time.Duration
	ProbeTimeout             time.Duration
	LivenessFailureThreshold int
	// EngineStallBound is how long a prepare, unprepare, stale release or
	// checkpoint save may be in flight before the engine check fails
	// (liveness.Engine); zero: liveness.DefaultStallBound.
	EngineStallBound time.Duration
	// HeartbeatPeriod is how often the node's heartbeat Lease (in
	// PodNamespace) is renewed while the DRA socket and NVML checks pass;
	// dra-controller taints the node's devices when it lapses. 0: off.
	HeartbeatPeriod time.Duration

	// DevicePluginCheckPeriod is how often the Node is read for resources
	// of NVIDIA's device plugin, while which nothing is published
	// (pkg/coexistence); 0: never (the flag's default is 10s).
	DevicePluginCheckPeriod time.Duration
	// StaleClaimGracePeriod is how long a prepared claim whose
	// ResourceClaim is gone (or no longer allocated here) is kept before
	// the plugin releases it (pkg/staleclaims); zero: never.
	StaleClaimGracePeriod time.Duration
	// PodResourcesSocket is the kubelet's pod-resources socket, asked
	// which containers use a stale claim before it is released; empty:
	// not asked (the pods and NVML still are).
	PodResourcesSocket string

	// Simulate selects a simulated machine instead of the real NVML.
	Simulate string
	// SimulateNodeMachines overrides Simulate per node ("node=machine,..."),
	// so that one DaemonSet simulates a mixed fleet; Validate resolves it.
	SimulateNodeMachines string
	// PrintSlices prints the ResourceSlices and exits without an API server.
	PrintSlices bool
	Out         io.Writer

	// KubeClient, when set, replaces the client built from Kubeconfig
	// (tests run the plugin against a fake clientset).
	KubeClient kubernetes.Interface
	// WrapNVML, when set, wraps the NVML the plugin uses, real or
	// simulated (the hardware check puts it behind a read-only guard).
	WrapNVML func(nvml.Interface) nvml.Interface
	// FaultHook, when set, is called at each crash-relevant step of
	// prepare/unprepare; crash tests kill the process from it.
	FaultHook func(point string)
	// SimulationHook, when set with Simulate, gets the simulated machine
	// before NVML is initialized (fault campaigns inject NVML errors and
	// lose GPUs through it while the plugin runs).
	SimulationHook func(*nvmlsim.Machine)

	// IMEX says how the node runs the IMEX daemons of compute domains.
	IMEX IMEXConfig
}

// Values of --metrics-auth.
const (
	MetricsAuthNone      = "none"
	MetricsAuthDelegated = "delegated"
)

// AddFlags registers the plugin's flags on fs.
func (c *Config) AddFlags(fs *pflag.FlagSet) {
	c.AddHardwareFlags(fs)
	fs.StringVar(&c.DriverName, "driver-name", vocabulary.DriverName, "DRA driver name published in ResourceSlices and used for the kubelet registration.")
	fs.StringVar(&c.NodeName, "node-name", "", "Name of the node this plugin runs on; names the resource pool.")
	c.Options.AddFlags(fs, 100, 400, "API client QPS. The kubelet helper GETs each claim on prepare through this client; client-go's default of 5 makes each prepare wait ~200 ms. The burst lets a node's worth of claims prepared at once (200 one-GPU claims) go unthrottled.")
	fs.StringVar(&c.PluginDataDir, "plugin-data-dir", filepath.Join("/var/lib/kubelet/plugins", vocabulary.DriverName), "Directory for the plugin socket, checkpoint and simulation state.")
	fs.StringVar(&c.RegistrarDir, "registrar-dir", "/var/lib/kubelet/plugins_registry", "Kubelet plugin registration directory.")
	fs.StringVar(&c.CDIDir, "cdi-dir", "/var/run/cdi", "Directory for transient CDI specs, read by the container runtime.")
	fs.StringVar(&c.HostDriverRoot, "host-driver-root", "", "Path of the driver installation on the host, for the CDI specs the container runtime reads; default: --driver-root. Set it when the plugin runs in a container that mounts the host's driver root elsewhere, e.g. --driver-root=/driver-root --host-driver-root=/.")
	fs.StringVar(&c.DevicePolicyFile, "device-policy", "", "YAML file saying what each GPU publishes: whole GPU, dynamic MIG, time-slicing and MPS shares and their count, with per-GPU overrides by minor or UUID (see docs/device-model.md). Empty publishes everything a GPU supports.")
	fs.StringVar(&c.MPSDir, "mps-dir", filepath.Join("/var/lib/kubelet/plugins", vocabulary.DriverName, "mps"), "Directory for MPS control daemons' pipes and logs (at most 60 bytes; must be a host path, containers mount the pipes from it).")
	fs.StringVar(&c.MPSControl, "mps-control", "", "nvidia-cuda-mps-control to run; default: the driver root's (in simulation, mps-control-sim beside this binary).")
	fs.StringVar(&c.MPSDaemonImage, "mps-daemon-image", "", "Run MPS control daemons as pods of this image (normally the plugin's own), bound to this node and owned by the plugin pod's DaemonSet, so that they survive plugin restarts; empty runs them as processes of the plugin, which die with its container.")
	fs.StringVar(&c.MPSShmSize, "mps-shm-size", "", "With --mps-daemon-image: size of the tmpfs, a whole number of mebibytes (e.g. 1Gi), that each MPS device's daemon and clients share as /dev/shm, where CUDA keeps the MPS server's shared memory; the plugin mounts it below --mps-dir, whose host mount needs Bidirectional propagation. Empty: none.")
	fs.StringVar(&c.MPSDaemonPriorityClass, "mps-daemon-priority-class", "", "Priority class of MPS control daemon pods.")
	fs.StringVar(&c.MPSDaemonServiceAccount, "mps-daemon-service-account", "", "Service account of MPS control daemon pods (they mount no token); empty: the namespace's default.")
	fs.StringVar(&c.MPSDaemonDisruptionBudget, "mps-daemon-disruption-budget", "", "With --mps-daemon-image: PodDisruptionBudget in --pod-namespace that refuses every eviction of MPS control daemon pods, made their controller so that kubectl drain evicts their clients without --force while the plugin removes each daemon after its last client (docs/operations.md). Empty: daemon pods have no controller and drain needs --force.")
	fs.StringVar(&c.PodName, "pod-name", "", "Name of the plugin's own pod (downward API), for the owner of MPS control daemon pods.")
	fs.StringVar(&c.PodNamespace, "pod-namespace", "", "Namespace of the plugin's own pod (downward API); MPS control daemon pods are created there.")
	fs.StringVar(&c.PodUID, "pod-uid", "", "UID of the plugin's own pod (downward API). Set, a new plugin pod serves beside the old one during a rolling upgrade (kubelet 1.33 or newer): socket names carry the UID, and the node's state is handed over under a lock in --plugin-data-dir (docs/operations.md, Upgrade).")
	fs.StringVar(&c.IgnoredXIDs, "ignored-xids", health.FormatXIDs(health.DefaultIgnoredXIDs), "XIDs that do not make a GPU unhealthy (application errors; see docs/health.md).")
	fs.DurationVar(&c.HealthRecoveryWindow, "health-recovery-window", 10*time.Minute, "Quiet time after the last critical event before an unhealthy GPU is untainted; a GPU reset recovers at once, a lost GPU only when it answers again.")
	fs.StringVar(&c.HealthTaintEffects, "health-taint-effects", "", "Taint effect per reason, e.g. GPULost=NoExecute,XID79=NoExecute,XID48=NoSchedule; reasons not listed get NoSchedule. Empty: the defaults of docs/health.md.")
	fs.StringVar(&c.MetricsAddress, "metrics-address", ":9400", "Address for Prometheus /metrics (and, in simulation, /simulate/event); empty disables it.")
	fs.StringVar(&c.LocalMetricsAddress, "local-metrics-address", "", "Loopback address (127.0.0.1:PORT) serving /metrics without authentication inside the plugin's pod, for `kubectl gpu top` through pods/portforward; needs --metrics-address; empty disables it.")
	fs.BoolVar(&c.DCGMMetrics, "dcgm-metrics", false, "Also serve the device readings under dcgm-exporter's metric and label names (DCGM_FI_DEV_GPU_UTIL, ...; namespace, pod, container), so dashboards written for dcgm-exporter keep working; docs/telemetry.md.")
	fs.StringVar(&c.MetricsAuth, "metrics-auth", MetricsAuthNone, "Who may use the metrics address: "+MetricsAuthNone+" (anyone, plain HTTP unless --metrics-tls-cert-file is given), or "+MetricsAuthDelegated+
		" (HTTPS; a bearer token the API server authenticates with a TokenReview, whose user may get the non-resource URL /metrics, or post /simulate/event, by a SubjectAccessReview; docs/telemetry.md).")
	fs.StringVar(&c.MetricsCertFile, "metrics-tls-cert-file", "", "HTTPS serving certificate of the metrics address (with --metrics-tls-key-file); empty with --metrics-auth=delegated: a self-signed one generated at start.")
	fs.StringVar(&c.MetricsKeyFile, "metrics-tls-key-file", "", "Private key of --metrics-tls-cert-file.")
	fs.StringVar(&c.ProbeAddress, "probe-address", ":8081", "Address for the kubelet's readiness (/readyz) and liveness (/livez) probes, plain HTTP without credentials; the answers name the checks (DRA socket, registration socket, NVML, engine) and say ok or failed, nothing else. Empty disables it.")
	fs.DurationVar(&c.ProbePeriod, "probe-period", liveness.DefaultPeriod, "How often the probe checks run: the DRA and registration sockets answer a call, NVML answers DeviceGetCount.")
	fs.DurationVar(&c.ProbeTimeout, "probe-timeout", liveness.DefaultTimeout, "How long a probe check may take before it counts as failed (a hung NVML call); at most --probe-period.")
	fs.DurationVar(&c.EngineStallBound, "engine-stall-bound", liveness.DefaultStallBound, "How long a prepare, unprepare, stale release or checkpoint save may run (a probe's pass through the engine's locks too) before the engine probe check fails: /readyz at once, the heartbeat stops, /livez after --liveness-failure-threshold rounds. Keep it above the longest MIG reconfiguration and the kubelet's 45s call timeout.")
	fs.IntVar(&c.LivenessFailureThreshold, "liveness-failure-threshold", liveness.DefaultFailureThreshold, "Consecutive failed rounds of a probe check before /livez fails and the kubelet restarts the plugin; /readyz fails at the first.")
	fs.DurationVar(&c.DevicePluginCheckPeriod, "device-plugin-check-period", 10*time.Second, "How often to read this node's Node for resources that NVIDIA's device plugin advertises (nvidia.com/gpu, nvidia.com/gpu.*, nvidia.com/mig-*) and its ResourceSlices of NVIDIA's DRA driver (gpu.nvidia.com, not written by this plugin); while there are any, no devices are published, so two drivers never hand out the same GPUs (docs/migration.md). 0 disables both checks.")
	fs.DurationVar(&c.StaleClaimGracePeriod, "stale-claim-grace-period", 5*time.Minute, "How long a prepared claim whose ResourceClaim is gone, has another UID or is no longer allocated to this node stays prepared before the plugin releases it (the kubelet lost its record of the claim); well above the kubelet's own cleanup after a restart (about 80 s). 0 never releases (docs/operations.md).")
	fs.StringVar(&c.PodResourcesSocket, "pod-resources-socket", "/var/lib/kubelet/pod-resources/kubelet.sock", "The kubelet's PodResources socket: a stale claim a container the kubelet lists still uses is not released, nor is one when the socket cannot be read (docs/operations.md, Stale claims). Empty: the kubelet is not asked.")
	fs.DurationVar(&c.HeartbeatPeriod, "heartbeat-period", heartbeat.DefaultPeriod, "How often the node's heartbeat Lease (gpu-dra-heartbeat-<node> in --pod-namespace) is renewed; it is renewed only while the DRA socket and NVML answer the probe checks and the engine is not stalled (--engine-stall-bound) (every --probe-period), and dra-controller taints the node's devices when it lapses (docs/operations.md, Outage). 0 turns it off.")
	fs.StringVar(&c.SimulateNodeMachines, "simulate-node-machines", "", "For demos and tests only, with --simulate: NODE=MACHINE,... simulates MACHINE instead of --simulate's on the node named NODE (a mixed fleet from one DaemonSet).")
	fs.BoolVar(&c.DeviceMetadata, "device-metadata", true, "Give every prepared device's containers its metadata (KEP-5304, beta in Kubernetes 1.37): the kubelet plugin helper writes /var/run/kubernetes.io/dra-device-attributes/resourceclaims/<claim>/<request>/gpu.dra.dev-metadata.json (resourceclaimtemplates/<pod claim name>/... for a claim from a template; the driver name is --driver-name's) with the device's UUID (a MIG device's own and its GPU's), PCI address, NUMA node and published attributes, and a CDI spec in --cdi-dir that mounts it (docs/cdi.md).")
	c.IMEX.addFlags(fs)
	fs.BoolVar(&c.PrintSlices, "print-slices", false, "Print the ResourceSlices this node would publish as a YAML stream and exit, without contacting an API server.")
}

// AddHardwareFlags registers the flags that say where the GPUs and the
// driver are: --driver-root, --sysfs-root, --nvml-library and --simulate.
// The hardware check (pkg/hwcheck) registers the same flags through it.
func (c *Config) AddHardwareFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.DriverRoot, "driver-root", "/", "Path of the NVIDIA driver installation (device nodes, libraries, binaries) as the plugin sees it.")
	fs.StringVar(&c.SysfsRoot, "sysfs-root", "/sys", "Path of the host's sysfs, for PCIe root and NUMA attributes.")
	fs.StringVar(&c.NVMLLibraryPath, "nvml-library", "libnvidia-ml.so.1", "NVML library to load.")
	fs.StringVar(&c.Simulate, "simulate", "", fmt.Sprintf("For demos and tests only: use a simulated machine instead of real GPUs, one of %v; one with an NVLink fabric may add @RACK or @RACK/CLIQUE (gb200nvl72@rack-a: the trays of one rack share the NVLink cluster UUID and clique).", nvmlsim.Machines()))
}

// shmSize is what --mps-shm-size accepts: a plain size, without the
// decimal exponents that make resource.ParseQuantity slow.
var shmSize = regexp.MustCompile(`^-?[0-9]{1,16}(\.[0-9]{1,9})?(Ki|Mi|Gi|Ti|k|M|G|T)?$`)

// podUID is what --pod-uid accepts: it becomes part of socket file names.
var podUID = regexp.MustCompile(`^[A-Za-z0-9-]{1,64}$`)

// maxShmSize bounds --mps-shm-size: more than any node's memory is a typo.
const maxShmSize = 1 << 40

// checkShmSize accepts a tmpfs size that the kernel applies as written: the
// kernel rounds a tmpfs size up to whole pages, so the size must be a whole
// number of mebibytes (a multiple of every page size up to 1Mi).
func checkShmSize(s string) error {
	if !shmSize.MatchString(s) {
		return fmt.Errorf("must be a size such as 512Mi or 1Gi")
	}
	q := resource.MustParse(s)
	switch b := q.Value(); {
	case q.Sign() < 0:
		return fmt.Errorf("must not be negative")
	case b > maxShmSize:
		return fmt.Errorf("must be at most 1Ti")
	case b%(1<<20) != 0 || resource.NewQuantity(b, resource.BinarySI).Cmp(q) != 0:
		return fmt.Errorf("must be a whole number of mebibytes (a multiple of 1Mi), which the kernel applies without "+
			"rounding to pages: use %dMi or %dMi", b>>20, (b+1<<20-1)>>20)
	}
	return nil
}

// Validate reports configuration errors before anything starts.
func (c *Config) Validate() error {
	if c.NodeName == "" {
		return fmt.Errorf("--node-name is required")
	}
	if c.DriverName == "" {
		return fmt.Errorf("--driver-name must not be empty")
	}
	if c.MPSShmSize != "" {
		if err := checkShmSize(c.MPSShmSize); err != nil {
			return fmt.Errorf("--mps-shm-size=%q: %w", c.MPSShmSize, err)
		}
		if q := resource.MustParse(c.MPSShmSize); q.Sign() > 0 && c.MPSDaemonImage == "" {
			return fmt.Errorf("--mps-shm-size needs --mps-daemon-image: a daemon run as the plugin's own process cannot see the tmpfs at /dev/shm")
		}
	}
	if c.PodUID != "" && !podUID.MatchString(c.PodUID) {
		return fmt.Errorf("--pod-uid=%q: must be a pod UID (letters, digits and dashes, at most 64): it names the plugin's sockets", c.PodUID)
	}
	if c.MetricsAuth != "" && c.MetricsAuth != MetricsAuthNone && c.MetricsAuth != MetricsAuthDelegated {
		return fmt.Errorf("--metrics-auth=%q: want %s or %s", c.MetricsAuth, MetricsAuthNone, MetricsAuthDelegated)
	}
	if c.LocalMetricsAddress != "" {
		if err := checkLoopback(c.LocalMetricsAddress); err != nil {
			return fmt.Errorf("--local-metrics-address=%q: %w", c.LocalMetricsAddress, err)
		}
		if c.MetricsAddress == "" {
			return fmt.Errorf("--local-metrics-address needs --metrics-address (the readings are collected for it)")
		}
	}
	if (c.MetricsCertFile == "") != (c.MetricsKeyFile == "") {
		return fmt.Errorf("--metrics-tls-cert-file and --metrics-tls-key-file go together (got %q and %q)", c.MetricsCertFile, c.MetricsKeyFile)
	}
	if c.HeartbeatPeriod < 0 {
		return fmt.Errorf("--heartbeat-period=%s: must not be negative", c.HeartbeatPeriod)
	}
	if c.HeartbeatPeriod > 0 && c.PodNamespace == "" && !c.PrintSlices {
		return fmt.Errorf("--heartbeat-period=%s needs --pod-namespace (POD_NAMESPACE from the downward API), where its Lease lives; --heartbeat-period=0 turns the heartbeat off", c.HeartbeatPeriod)
	}
	if err := c.IMEX.validate(); err != nil {
		return err
	}
	if c.EngineStallBound < 0 {
		return fmt.Errorf("--engine-stall-bound=%s: must be positive (0 takes the default %s)", c.EngineStallBound, liveness.DefaultStallBound)
	}
	if c.HeartbeatPeriod > 0 || c.ProbeAddress != "" {
		if _, err := c.prober(func() nvml.Interface { return nil }, func() liveness.Stalls { return nil }); err != nil {
			return fmt.Errorf("--probe-period, --probe-timeout, --liveness-failure-threshold: %w", err)
		}
	}
	if c.DevicePluginCheckPeriod < 0 {
		return fmt.Errorf("--device-plugin-check-period=%s: must not be negative (0 disables the check)", c.DevicePluginCheckPeriod)
	}
	if c.StaleClaimGracePeriod < 0 {
		return fmt.Errorf("--stale-claim-grace-period=%s: must not be negative (0 turns releasing stale claims off)", c.StaleClaimGracePeriod)
	}
	if c.PodResourcesSocket != "" && !filepath.IsAbs(c.PodResourcesSocket) {
		return fmt.Errorf("--pod-resources-socket=%q: must be an absolute path (empty: the kubelet is not asked)", c.PodResourcesSocket)
	}
	if c.HostDriverRoot != "" && !filepath.IsAbs(c.HostDriverRoot) {
		return fmt.Errorf("--host-driver-root=%q: must be an absolute path", c.HostDriverRoot)
	}
	if err := c.resolveSimulatedMachine(); err != nil {
		return err
	}
	if c.Simulate != "" {
		if err := nvmlsim.CheckMachine(c.Simulate); err != nil {
			return fmt.Errorf("--simulate=%q: %w", c.Simulate, err)
		}
	}
	return nil
}

// resolveSimulatedMachine sets Simulate to this node's entry of
// SimulateNodeMachines, after checking every entry.
func (c *Config) resolveSimulatedMachine() error {
	if c.SimulateNodeMachines == "" {
		return nil
	}
	if c.Simulate == "" {
		return fmt.Errorf("--simulate-node-machines needs --simulate")
	}
	mine := ""
	seen := map[string]bool{}
	for _, entry := range strings.Split(c.SimulateNodeMachines, ",") {
		node, machine, ok := strings.Cut(entry, "=")
		switch {
		case !ok || node == "":
			return fmt.Errorf("--simulate-node-machines: entry %q: want NODE=MACHINE", entry)
		case seen[node]:
			return fmt.Errorf("--simulate-node-machines: node %q given twice", node)
		}
		if err := nvmlsim.CheckMachine(machine); err != nil {
			return fmt.Errorf("--simulate-node-machines: entry %q: %w", entry, err)
		}
		seen[node] = true
		if node == c.NodeName {
			mine = machine
		}
	}
	if mine != "" {
		c.Simulate = mine
	}
	return nil
}

// checkLoopback accepts HOST:PORT with a loopback IP: the address serves
// without authentication, so nothing outside the pod may reach it.
func checkLoopback(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("host %q must be a loopback IP (127.0.0.1 or ::1): the address serves without authentication", host)
	}
	return nil
}
