// Package campaign is a seeded, replayable fault campaign against the real
// kubelet plugin: the plugin runs as a child process (internal/pluginrun/childproc)
// on a simulated dgxh100 whose state persists across restarts
// (pkg/nvmlsim), the kubelet stand-in calls it over its real sockets, and
// claims for whole GPUs, dynamic MIG devices, time-slicing and MPS shares
// and GPUs passed through to VMs (vfio-pci; every GPU's policy allows it)
// are allocated by the upstream allocator from the node's published slices.
// Besides the checkpoint, spec and MIG invariants below, a GPU off the
// nvidia driver (or with a driver_override left) must belong to a live
// claim's entry, and a prepared passthrough claim's GPU must be on vfio-pci.
// GPU 7 carries a MIG instance an admin made before the plugin ran.
//
// Compute domains (channels_test.go): the plugin runs with IMEX daemons
// (cmd/imex-sim) and two or three ComputeDomains (the seed picks how many)
// in a fake API of its own, each with its channel number (status.channel),
// every other one in template mode. Channel claims, as dra-controller
// creates them (computedomain.ChannelClaim, or a pod's claim from
// computedomain.ChannelClaimTemplate; a domain may have several at once,
// all of its channel, sharing its daemon), are allocated by the upstream allocator from the channel
// pool of the node's clique (imexchannels.Resources, 32 channels; the node
// carries the clique label nodelabels gives it). The DGX H100's GPUs have
// an NVLink fabric, so a clique; its driver root gets the pool's channel
// device nodes (nvmlsim SetIMEXChannels). A domain has at most two live
// channel claims; a fresh one is half the time of a domain with live claims,
// else of any, which the node refuses while it serves another (a node
// serves one compute domain at a time): that refusal is expected while a
// live claim of another domain exists, and the kubelet retries or
// unprepares the claim. The summary counts the channel claims prepared per
// domain, the refusals, and how often the node changed domains.
//
// The seed (-seed, printed first; `make campaign SEED=N` replays it) fixes
// the sequence of operations and faults. Which of several concurrent calls
// reaches a fault point first, and where a random kill lands, depend on
// timing, so a replay repeats the scenario, not every interleaving.
//
// # Operations
//
// Prepare of a fresh claim, repeated prepare of a prepared claim (it must
// return the same CDI devices), unprepare, and the kubelet's retries of
// failed calls; one to four of them at once on different claims; the end
// of a compute domain's job (all its channel claims unprepared at once).
// After every restart a fresh claim is prepared (when the plugin is not
// armed with a fault point; a channel claim only of a domain the node may
// serve).
//
// # Faults and what the campaign expects of each
//
// The model is what the kubelet knows: a claim is prepared (the kubelet got
// success and did not unprepare it), pending prepare (a prepare failed or
// was cut off: the plugin may hold it completed or not at all, and the
// kubelet retries or unprepares), or pending unprepare (retried until it
// succeeds). A successful unprepare releases the claim's allocation.
//
//   - SIGKILL at a driver fault point, at a random moment during calls,
//     and in the middle of start-up recovery: calls cut off may fail;
//     after the restart no claim is left half done, every prepared claim
//     is still completed with its spec, and the retries succeed. Every
//     prepare and unprepare point must be hit in every run, whatever the
//     seed: half the plugin starts are armed, while a call point is unhit
//     with the next unhit one in turn (one whose plugin was killed or
//     restarted for another fault before a call reached it comes round
//     again), and the operations then mostly make the call that passes it
//     (prepare:imex-domain-recorded: a channel claim's prepare).
//     A point still unhit when the operations are done is armed again, up
//     to three times, with that call made at once; a point no call passes
//     fails the run (TestCoverageRuleFailsOnUnreachablePoint). Recovery's
//     points fire only when the node's state calls for them: they are
//     armed once the call points are hit, and counted, not required
//     (test/crash kills at each of them deterministically).
//   - A deleted, corrupt or truncated checkpoint (while the plugin is
//     down): the plugin rebuilds the prepared claims from their CDI specs;
//     nothing prepared is lost and nothing leaks.
//   - A deleted or corrupt CDI spec: the plugin writes the spec of a
//     prepared claim again at start; a spec of a claim it does not hold is
//     removed.
//   - A GPU lost while the plugin runs (and brought back later): calls on
//     claims of that GPU may fail, calls on other GPUs must succeed; claims
//     prepared on it stay recorded. A GPU lost across a restart: the plugin
//     must start and serve the other GPUs; what it cannot undo on the lost
//     GPU (a rollback, destroying a MIG instance whose record was lost)
//     may wait for a start with the GPU back, and is checked from then on.
//   - An NVML error in one call on one GPU (creating or destroying a MIG
//     instance, setting the compute or MIG mode): the call on a claim of
//     that GPU may fail and must leave nothing behind that its retry
//     cannot clean up; other calls must succeed.
//   - A claim whose prepare failed, unprepared by the kubelet, allocated
//     again to other devices and prepared: the plugin prepares the new
//     devices and the old ones are free.
//   - A hand-over, as a rolling update does it (handover_test.go): a
//     second instance starts while the first serves (with calls in flight,
//     armed with a fault point if its start was), registers and waits for
//     the hand-over lock with the calls the kubelet sends it; the old one
//     gets SIGTERM (sometimes SIGKILL). The new one answers its waiting
//     calls and holds all the old one did; the journal of mutating steps
//     shows the old one mutated nothing after it released the lock or
//     after the new one took it. Every run hands over at random at least
//     once, and once with the old one armed and calls in flight that
//     reach its point (it dies mid-operation while the new one waits).
//   - A claim with admin access (monitoring) to a device a prepared claim
//     holds (a held MIG device's parent GPU), or to the static MIG device
//     (admin_test.go): it prepares beside the holder, and either may go
//     first.
//   - Stale claims (stale_test.go; the plugin runs with a 1 s grace period
//     and asks the campaign's PodResources API, which lists a container
//     for every claim the kubelet holds prepared): a prepared claim's
//     ResourceClaim deleted while its container runs must stay prepared
//     past the grace period, and a whole-GPU claim the scheduler then
//     gives its GPU must not prepare until the container ends and the
//     stale claim is released (stale-live); one whose container ended is
//     released (stale-dead); one reallocated on this node to other GPUs
//     under the same UID after its pod ended prepares with its new devices
//     once the old preparation is released (stale-reallocated).
//
// # Invariants
//
// After every call or batch of calls, and (stricter) after every restart:
// each prepared claim is completed in the checkpoint with the devices of
// its allocation, its CDI spec is valid and resolves the IDs the kubelet
// got, its MIG instance exists, and its share is registered with its
// sharing manager (an MPS share's control daemon runs); nothing leaks: each
// checkpoint entry, CDI spec, driver-made MIG instance, time-slicing and
// MPS share belongs to a claim the kubelet has not unprepared, no MPS
// daemon runs without shares, no GPU keeps a time-slice level or the
// exclusive compute mode without shares, and the static MIG instance
// survives. No device (nor share of one) is prepared for two claims
// while either's container runs, and a whole GPU prepared for one claim
// is prepared for no other, unless a claim has admin access. After a
// restart, no claim is half done and a spec exists
// exactly for each completed claim. The plugin serves within 30 s of each
// start (no crash loop) and prepares a fresh claim. At the end every claim
// is unprepared and the node must be clean: empty checkpoint, no specs, no
// MIG instance but the static one, no IMEX daemon and no daemon files.
//
// Compute domains (channelcheck_test.go, read as test/node does: the
// daemons' state directories and records under the plugin's imex directory,
// and the imex-sim processes running a domain's config): a prepared channel
// claim's checkpoint record names its channel and domain (with the domain's
// UID) and its CDI device gives /dev/nvidia-caps-imex-channels/channel<N>;
// a domain's daemon runs exactly while the checkpoint holds a channel of
// the domain, once (no two processes), whenever one of its claims is
// prepared and never without a live claim of it (no daemon, record or
// files left after the last is unprepared), its record lists each prepared
// claim of the domain and no claim the kubelet unprepared, and no two
// domains' daemons run at once. No channel is held by claims of two
// domains (checkpoint records).
//
// Each violation is reported once, with the op index and the faults since
// the last restart; the summary line is `campaign: N operations, F faults,
// V invariant violations`, followed by the kills at each fault point, and
// the test fails if V > 0 or a call point was never hit.
//
// # Open bugs
//
// Some fault kinds hit crash-safety bugs still open in pkg/prepare; each is
// a named switch of -open-bugs (default all, so the campaign fails until
// they are fixed; -open-bugs=none leaves them out, a comma-separated list
// enables some): see openBugs. The switches compose: a damaged checkpoint
// while claims are prepared is rebuilt-checkpoint, so
// damaged-checkpoint-midway fires only together with it. When a bug is fixed, drop its switch.
//
// A plugin that cannot start after four tries ends the campaign (the rest
// would only repeat the crash loop); its violations are reported.
package campaign
