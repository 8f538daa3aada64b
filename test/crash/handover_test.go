package crash

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	at "github.com/gpu-dra/gpu-dra-driver/internal/allocatortest"
	"github.com/gpu-dra/gpu-dra-driver/internal/pluginrun"
	"github.com/gpu-dra/gpu-dra-driver/internal/pluginrun/childproc"
	"github.com/gpu-dra/gpu-dra-driver/internal/simnode"
	"github.com/gpu-dra/gpu-dra-driver/pkg/checkpoint"
	"github.com/gpu-dra/gpu-dra-driver/pkg/deviceclass"
	"github.com/gpu-dra/gpu-dra-driver/pkg/handover"
)

// TestRollingHandOver runs a rolling update's two plugin instances on one
// node: the new one registers and is Ready while the old one owns the
// node, its prepare waits until the old one is gone (stopped, or killed),
// and it then works on everything the old one did, also after it started.
// The journal of every mutating step shows the two never both mutate.
func TestRollingHandOver(t *testing.T) {
	for name, end := range map[string]func(*childproc.Child) error{
		"SIGTERM": (*childproc.Child).Stop,
		"SIGKILL": func(c *childproc.Child) error { c.Kill(); return nil },
	} {
		t.Run(name, func(t *testing.T) { rollingHandOver(t, end) })
	}
}

func rollingHandOver(t *testing.T, endOld func(*childproc.Child) error) {
	dirs, err := pluginrun.NewDirs(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	node := simnode.New(t, machine, nodeName)
	cluster := at.NewCluster(node.Slices(driverName), deviceclass.DeviceClasses(driverName))
	claims := cluster.MustAllocate(t, nodeName,
		at.Claim("before", at.Exactly("gpus", driverName, 1)),
		at.Claim("waiting", at.Exactly("mig", "mig."+driverName, 1, `device.attributes["gpu.dra.dev"].profile == "2g.20gb"`)),
		at.Claim("meanwhile", at.Exactly("gpus", driverName, 1)))
	before, waiting, meanwhile := claims[0], claims[1], claims[2]
	data, err := json.Marshal(claims)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dirs.Root, claimsFile), string(data))
	ctx := context.Background()

	oldPod := childproc.Pod{UID: "0ld00000-0000-0000-0000-000000000001"}
	old := startPod(t, dirs, oldPod)
	if _, err := old.Kubelet.PrepareOne(ctx, before); err != nil {
		t.Fatalf("prepare on the old instance: %v\n%s", err, pluginLog(dirs))
	}

	// The new instance registers and is Ready without the lock: the
	// DaemonSet deletes the old pod only once the new one is Ready.
	probe, err := pluginrun.FreeAddress()
	if err != nil {
		t.Fatal(err)
	}
	neu := startPod(t, dirs, childproc.Pod{UID: "ne000000-0000-0000-0000-000000000002", ProbeAddress: probe})
	defer neu.Kill()
	waitReady(t, dirs, probe)

	callCtx, cancel := context.WithTimeout(ctx, 90*time.Second) // the kubelet gives a call 45 s
	defer cancel()
	waited := make(chan error, 1)
	go func() { _, err := neu.Kubelet.PrepareOne(callCtx, waiting); waited <- err }()
	select {
	case err := <-waited:
		t.Fatalf("the new instance prepared (%v) while the old one owns the node\n%s", err, pluginLog(dirs))
	case <-time.After(2 * time.Second):
	}
	// The old one still serves, and what it does now the new one must see.
	if _, err := old.Kubelet.PrepareOne(ctx, meanwhile); err != nil {
		t.Fatalf("prepare on the old instance while the new one waits: %v\n%s", err, pluginLog(dirs))
	}
	if o, err := handover.ReadOwner(dirs.PluginData); err != nil || o.PID != old.Pid() {
		t.Fatalf("owner while the new instance waits = %+v, %v; want the old instance (pid %d)", o, err, old.Pid())
	}
	if got := preparedUIDs(t, dirs); len(got) != 2 || got[waiting.UID] {
		t.Fatalf("checkpoint while the new instance waits = %v, want only the old instance's 2 claims", got)
	}

	if err := endOld(old); err != nil {
		t.Fatalf("old instance: %v\n%s", err, pluginLog(dirs))
	}
	select {
	case err := <-waited:
		if err != nil {
			t.Fatalf("the new instance's waiting prepare after the hand-over: %v\n%s", err, pluginLog(dirs))
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("the new instance's prepare still waits after the old one ended\n%s", pluginLog(dirs))
	}
	if o, err := handover.ReadOwner(dirs.PluginData); err != nil || o.PID != neu.Pid() || o.PodUID == "" {
		t.Fatalf("owner after the hand-over = %+v, %v; want the new instance (pid %d)", o, err, neu.Pid())
	}
	// The old instance's sockets are gone (a killed one's removed by the
	// new owner), or the kubelet would keep trying to register them.
	for _, sock := range []string{
		filepath.Join(dirs.Registrar, kubeletplugin.RollingUpdateRegistrarSocketFile(dirs.Registrar, driverName, types.UID(oldPod.UID))),
		filepath.Join(dirs.PluginData, "dra-"+oldPod.UID+".sock"),
	} {
		if _, err := os.Stat(sock); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the old instance's socket %s is still there (%v)", sock, err)
		}
	}
	if got := preparedUIDs(t, dirs); len(got) != 3 {
		t.Fatalf("checkpoint after the hand-over = %v, want all 3 claims (the new instance read the old one's last write)", got)
	}
	// The new instance unprepares what the old one prepared.
	for _, c := range []*resourceapi.ResourceClaim{meanwhile, before, waiting} {
		if err := neu.Kubelet.UnprepareOne(ctx, c); err != nil {
			t.Fatalf("unprepare %s on the new instance: %v\n%s", c.Name, err, pluginLog(dirs))
		}
	}
	if got := preparedUIDs(t, dirs); len(got) != 0 {
		t.Fatalf("checkpoint after unprepare = %v, want empty", got)
	}
	checkJournal(t, dirs, old.Pid(), neu.Pid())
	stopChild(t, neu)
}

// checkJournal asserts that the old instance's mutating steps all come
// before the new one's first.
func checkJournal(t *testing.T, dirs pluginrun.Dirs, oldPID, newPID int) {
	t.Helper()
	steps, err := childproc.Journal(dirs)
	if err != nil {
		t.Fatal(err)
	}
	seenNew, counts := false, map[int]int{}
	for i, s := range steps {
		counts[s.PID]++
		switch s.PID {
		case newPID:
			seenNew = true
		case oldPID:
			if seenNew {
				t.Fatalf("step %d: the old instance (pid %d) mutated at %s after the new one began: %v", i, oldPID, s.Point, steps)
			}
		default:
			t.Fatalf("step %d from an unknown pid %d: %v", i, s.PID, steps)
		}
	}
	if counts[oldPID] == 0 || counts[newPID] == 0 {
		t.Fatalf("journal %v: want steps of both instances", steps)
	}
}

func startPod(t *testing.T, dirs pluginrun.Dirs, pod childproc.Pod) *childproc.Child {
	t.Helper()
	c, err := childproc.StartPod(dirs, pod, 60*time.Second)
	if err != nil {
		t.Fatalf("start pod %s: %v\n%s", pod.UID, err, pluginLog(dirs))
	}
	return c
}

// preparedUIDs reads the checkpoint as the node has it.
func preparedUIDs(t *testing.T, dirs pluginrun.Dirs) map[types.UID]bool {
	t.Helper()
	cp, err := checkpoint.NewFileStore(checkpointPath(dirs)).Load(context.Background())
	if err != nil {
		t.Fatalf("load checkpoint: %v", err)
	}
	out := map[types.UID]bool{}
	for _, c := range cp.All() {
		out[c.UID] = true
	}
	return out
}

// waitReady waits for the instance's /readyz to pass.
func waitReady(t *testing.T, dirs pluginrun.Dirs, addr string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	var last string
	for time.Now().Before(deadline) {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
			last = resp.Status
		} else {
			last = err.Error()
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("new instance not Ready while it waits for the hand-over: %s\n%s", last, pluginLog(dirs))
}
