package podattribution

import (
	"context"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2/ktesting"

	"github.com/gpu-dra/gpu-dra-driver/internal/testfs"
)

const (
	podUID = "3e9a1c2b-7f4d-4c1e-9b2a-5d6e7f8a9b0c"
	ctrID  = "8f1c2d3e4b5a69788796a5b4c3d2e1f00112233445566778899aabbccddeeff"
)

func TestParseCgroup(t *testing.T) {
	systemdUID := "3e9a1c2b_7f4d_4c1e_9b2a_5d6e7f8a9b0c"
	tests := map[string]struct {
		content string
		want    ProcessOwner
		wantErr bool
	}{
		"cgroupfs, v1 hybrid (the local cluster)": {
			content: "12:pids:/kubepods/burstable/pod" + podUID + "/" + ctrID + "\n" +
				"11:memory:/kubepods/burstable/pod" + podUID + "/" + ctrID + "\n0::/\n",
			want: ProcessOwner{PodUID: podUID, ContainerID: ctrID},
		},
		"cgroupfs, guaranteed QoS": {
			content: "4:cpu,cpuacct:/kubepods/pod" + podUID + "/" + ctrID + "\n",
			want:    ProcessOwner{PodUID: podUID, ContainerID: ctrID},
		},
		"cgroupfs, v2": {
			content: "0::/kubepods/besteffort/pod" + podUID + "/" + ctrID + "\n",
			want:    ProcessOwner{PodUID: podUID, ContainerID: ctrID},
		},
		"systemd, v2, containerd": {
			content: "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + systemdUID + ".slice/cri-containerd-" + ctrID + ".scope\n",
			want:    ProcessOwner{PodUID: podUID, ContainerID: ctrID},
		},
		"systemd, v1, CRI-O, guaranteed": {
			content: "5:memory:/kubepods.slice/kubepods-pod" + systemdUID + ".slice/crio-" + ctrID + ".scope\n",
			want:    ProcessOwner{PodUID: podUID, ContainerID: ctrID},
		},
		"systemd, docker": {
			content: "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + systemdUID + ".slice/docker-" + ctrID + ".scope\n",
			want:    ProcessOwner{PodUID: podUID, ContainerID: ctrID},
		},
		"nested in a container runtime's own cgroup": {
			content: "0::/system.slice/containerd.service/kubepods/burstable/pod" + podUID + "/" + ctrID + "\n",
			want:    ProcessOwner{PodUID: podUID, ContainerID: ctrID},
		},
		"the pod's own cgroup": {
			content: "0::/kubepods/burstable/pod" + podUID + "\n",
			want:    ProcessOwner{PodUID: podUID},
		},
		"a host process":       {content: "0::/system.slice/sshd.service\n1:name=systemd:/user.slice\n", wantErr: true},
		"not a UID":            {content: "0::/kubepods/burstable/podcast/" + ctrID + "\n", wantErr: true},
		"empty":                {content: "", wantErr: true},
		"garbage":              {content: "\x00\x01 no colons here\n", wantErr: true},
		"upper-case UID":       {content: "0::/kubepods/pod3E9A1C2B-7F4D-4C1E-9B2A-5D6E7F8A9B0C/x\n", wantErr: true},
		"slice of no kubepods": {content: "0::/user.slice/user-pod" + systemdUID + ".slice/x.scope\n", wantErr: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := ParseCgroup(tc.content)
			if tc.wantErr {
				if err == nil {
					t.Fatalf("ParseCgroup = %+v, want an error", got)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Errorf("ParseCgroup = %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

// A process's cgroup is read once while NVML keeps listing its PID, and
// again once the PID was not seen; a gone process (no stat) is not read.
func TestProcessesCachePerPID(t *testing.T) {
	root := t.TempDir()
	testfs.WriteProcess(t, root, 10, 1000, "0::/kubepods/pod"+podUID+"/"+ctrID+"\n")
	testfs.WriteProcess(t, root, 11, 1000, "0::/system.slice/nvidia-persistenced.service\n")
	p := NewProcesses(root, nil)
	for range 3 {
		if o, ok := p.Owner(10); !ok || o.PodUID != podUID || o.ContainerID != ctrID {
			t.Fatalf("Owner(10) = %+v, %v", o, ok)
		}
		if _, ok := p.Owner(11); ok {
			t.Fatal("a host process has a pod")
		}
		if _, ok := p.Owner(12); ok {
			t.Fatal("a gone process has a pod")
		}
	}
	if n := p.Reads(); n != 2 {
		t.Errorf("%d cgroup reads for 2 live PIDs and a gone one over 3 scrapes, want 2", n)
	}
	p.Keep(map[uint32]bool{10: true})
	p.Owner(10)
	p.Owner(11)
	if n := p.Reads(); n != 3 {
		t.Errorf("%d cgroup reads after PID 11 was dropped and seen again, want 3", n)
	}
}

// A PID reused by another process between two scrapes (NVML lists it on
// both, so Keep never dropped it) is the new process: it is credited to
// its own pod, or to none, never to the old process's pod.
func TestProcessesPIDReused(t *testing.T) {
	const otherPod = "0b1c2d3e-4f50-4617-8293-a4b5c6d7e8f9"
	tests := map[string]struct {
		cgroup string
		want   ProcessOwner
		ok     bool
	}{
		"by a process of another pod": {cgroup: "0::/kubepods/pod" + otherPod + "/" + ctrID + "\n", want: ProcessOwner{PodUID: otherPod, ContainerID: ctrID}, ok: true},
		"by a host process":           {cgroup: "0::/system.slice/sshd.service\n"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			root := t.TempDir()
			testfs.WriteProcess(t, root, 10, 1000, "0::/kubepods/pod"+podUID+"/"+ctrID+"\n")
			p := NewProcesses(root, nil)
			if o, ok := p.Owner(10); !ok || o.PodUID != podUID {
				t.Fatalf("Owner(10) = %+v, %v; want pod %s", o, ok, podUID)
			}
			p.Keep(map[uint32]bool{10: true})
			testfs.WriteProcess(t, root, 10, 2000, tc.cgroup) // the old process exited, PID 10 reused
			if o, ok := p.Owner(10); ok != tc.ok || o != tc.want {
				t.Errorf("Owner(10) after reuse = %+v, %v; want %+v, %v", o, ok, tc.want, tc.ok)
			}
		})
	}
	t.Run("gone", func(t *testing.T) {
		root := t.TempDir()
		testfs.WriteProcess(t, root, 10, 1000, "0::/kubepods/pod"+podUID+"/"+ctrID+"\n")
		p := NewProcesses(root, nil)
		p.Owner(10)
		if err := os.RemoveAll(filepath.Join(root, "10")); err != nil {
			t.Fatal(err)
		}
		if o, ok := p.Owner(10); ok {
			t.Errorf("Owner of an exited process = %+v", o)
		}
	})
}

func TestParseStartTime(t *testing.T) {
	tests := map[string]struct {
		stat    string
		want    uint64
		wantErr bool
	}{
		"plain":              {stat: "42 (python3) S 1 42 42 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 123456 1000000 100\n", want: 123456},
		"name with ') ( '":   {stat: "42 (a) (b ) S) R 1 42 42 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 77 0 0", want: 77},
		"too short":          {stat: "42 (python3) S 1 42", wantErr: true},
		"no name":            {stat: "42 python3 S 1", wantErr: true},
		"start not a number": {stat: "42 (x) S 1 42 42 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 soon 0 0", wantErr: true},
		"empty":              {stat: "", wantErr: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := ParseStartTime(tc.stat)
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Errorf("ParseStartTime = %d, %v; want %d, error %v", got, err, tc.want, tc.wantErr)
			}
		})
	}
}

// A pod read at prepare has no container IDs yet; the first process of its
// container makes the attribution read it again and learn the ID.
func TestProcessesLearnContainerIDs(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pod := trainerPod("trainer-0", podUID)
	client := fake.NewClientset(pod)
	var gets atomic.Int64
	client.PrependReactor("get", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		gets.Add(1)
		return false, nil, nil
	})
	a := newAttribution(client.CoreV1(), workqueue.NewTypedItemExponentialFailureRateLimiter[podRef](time.Millisecond, 10*time.Millisecond))
	go a.Run(ctx)
	a.Record(ctx, reservedClaim("claim-1", podRef{Namespace: "ml", Name: "trainer-0", UID: podUID}))
	lookedUp(t, a, podUID)

	// The containers started.
	pod = pod.DeepCopy()
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "trainer", ContainerID: "containerd://" + ctrID}}
	if _, err := client.CoreV1().Pods("ml").UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	testfs.WriteProcess(t, root, 10, 1000, "0::/kubepods/pod"+podUID+"/"+ctrID+"\n")
	p := NewProcesses(root, a)
	a.mu.Lock()
	a.lookedUp[podUID] = time.Now().Add(-refreshInterval) // as if read a while ago
	a.mu.Unlock()
	p.Owner(10)
	deadline := time.Now().Add(10 * time.Second)
	for {
		var ids []string
		for _, c := range a.Consumers("claim-1") {
			if c.Container == "trainer" {
				ids = c.ContainerIDs
			}
		}
		if len(ids) == 1 && ids[0] == ctrID {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("container ID not learned within 10s: consumers %+v", a.Consumers("claim-1"))
		}
		time.Sleep(5 * time.Millisecond)
	}
	// Known now: more processes of it read nothing again.
	before := gets.Load()
	a.mu.Lock()
	a.lookedUp[podUID] = time.Now().Add(-refreshInterval)
	a.mu.Unlock()
	p.Owner(10)
	time.Sleep(50 * time.Millisecond)
	if got := gets.Load(); got != before {
		t.Errorf("%d more GETs for a known container", got-before)
	}
	if before != 2 {
		t.Errorf("%d GETs, want 2 (prepare, then the new container)", before)
	}
}
