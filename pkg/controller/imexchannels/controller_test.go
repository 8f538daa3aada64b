package imexchannels

import (
	"context"
	"slices"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"

	"github.com/gpu-dra/gpu-dra-driver/internal/standin/apiserver"

	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

const driver = "gpu.dra.dev"

// newClient is a fake clientset holding objs that names slices, records
// the controller's field manager on the slices it writes and applies field
// selectors to slices as the API server does.
func newClient(objs ...runtime.Object) *fake.Clientset {
	client := fake.NewClientset(objs...)
	apiserver.RecordFieldManager(client, "resourceslices", vocabulary.ControllerAgent)
	apiserver.GenerateNames(client)
	apiserver.SliceFieldSelectors(client)
	return client
}

// start runs the controller over client until the test ends.
func start(t *testing.T, client kubernetes.Interface, channels int) {
	t.Helper()
	t.Cleanup(startDriver(t, client, driver, channels))
}

// startDriver runs the controller for driverName over client until the
// returned stop is called.
func startDriver(t *testing.T, client kubernetes.Interface, driverName string, channels int) (stop func()) {
	t.Helper()
	return startDriverEvery(t, client, driverName, channels, 0)
}

// startDriverEvery is startDriver with the leftovers looked for every
// leftoverPeriod (0: the default).
func startDriverEvery(t *testing.T, client kubernetes.Interface, driverName string, channels int, leftoverPeriod time.Duration) (stop func()) {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	factory := informers.NewSharedInformerFactory(client, 0)
	c, err := New(client, factory.Core().V1().Nodes(), Options{DriverName: driverName, Channels: channels})
	if err != nil {
		t.Fatal(err)
	}
	c.leftoverPeriod = leftoverPeriod
	factory.Start(ctx.Done())
	done := make(chan error)
	go func() { done <- c.Run(ctx) }()
	return func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
		factory.Shutdown()
	}
}

// PublishedPools waits until the driver's slices without a node are
// exactly the pools of want (clique → channels), and returns the slices.
func PublishedPools(t *testing.T, client kubernetes.Interface, want map[string]int) []*resourceapi.ResourceSlice {
	t.Helper()
	return publishedPools(t, client, driver, want)
}

// publishedPools is PublishedPools for driverName.
func publishedPools(t *testing.T, client kubernetes.Interface, driverName string, want map[string]int) []*resourceapi.ResourceSlice {
	t.Helper()
	var got []*resourceapi.ResourceSlice
	var seen map[string]int
	err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		list, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		got, seen = nil, map[string]int{}
		for i := range list.Items {
			s := &list.Items[i]
			if s.Spec.Driver != driverName || s.Spec.NodeName != nil {
				continue
			}
			clique, _ := vocabulary.ChannelPoolClique(s.Spec.Pool.Name)
			seen[clique] += len(s.Spec.Devices)
			got = append(got, s)
		}
		if len(seen) != len(want) {
			return false, nil
		}
		for clique, n := range want {
			if seen[clique] != n {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("channel pools %v, want %v: %v", seen, want, err)
	}
	return got
}

func TestControllerFollowsCliqueLabels(t *testing.T) {
	const a, b = "5e1f0000-0000-0000-0000-00000000000a.1", "5e1f0000-0000-0000-0000-00000000000b.1"
	client := newClient(node("tray-1", a), node("tray-2", a), node("tray-3", b), node("pcie", ""))
	start(t, client, DefaultChannels)
	for _, s := range PublishedPools(t, client, map[string]int{a: DefaultChannels, b: DefaultChannels}) {
		if s.Spec.NodeSelector == nil || s.Spec.AllNodes != nil {
			t.Errorf("slice %s: node selector %v, all nodes %v", s.Name, s.Spec.NodeSelector, s.Spec.AllNodes)
		}
	}

	// Rack b's only tray loses its clique: its pool goes.
	n, err := client.CoreV1().Nodes().Get(t.Context(), "tray-3", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	delete(n.Labels, vocabulary.LabelClique)
	if _, err := client.CoreV1().Nodes().Update(t.Context(), n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	PublishedPools(t, client, map[string]int{a: DefaultChannels})

	// A new tray of a new clique adds a pool; a deleted node's clique, when
	// other nodes keep it, stays.
	if _, err := client.CoreV1().Nodes().Create(t.Context(), node("tray-4", b), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := client.CoreV1().Nodes().Delete(t.Context(), "tray-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	PublishedPools(t, client, map[string]int{a: DefaultChannels, b: DefaultChannels})
}

func TestControllerChannelCount(t *testing.T) {
	const a = "5e1f0000-0000-0000-0000-00000000000a.1"
	client := newClient(node("tray-1", a))
	start(t, client, 5)
	s := PublishedPools(t, client, map[string]int{a: 5})
	var names []string
	for _, d := range s[0].Spec.Devices {
		names = append(names, d.Name)
	}
	if !slices.Equal(names, []string{"channel-0", "channel-1", "channel-2", "channel-3", "channel-4"}) {
		t.Errorf("devices %v", names)
	}
}

func TestNewRefusesChannelCount(t *testing.T) {
	factory := informers.NewSharedInformerFactory(fake.NewClientset(), 0)
	for _, n := range []int{0, MaxChannels + 1} {
		if _, err := New(fake.NewClientset(), factory.Core().V1().Nodes(), Options{DriverName: driver, Channels: n}); err == nil {
			t.Errorf("%d channels accepted", n)
		}
	}
}
