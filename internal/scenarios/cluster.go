package scenarios

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"
)

// DefaultKubeconfig is the local cluster's admin kubeconfig (hack/cluster/up.sh).
const DefaultKubeconfig = "/tmp/gdd/kubeconfig/admin.kubeconfig"

// FieldManager is the server-side apply field manager of the scenario objects.
const FieldManager = "gpu-dra-demo"

// Cluster is a connection to the cluster the scenarios run on.
type Cluster struct {
	Kubeconfig string
	Config     *rest.Config
	Client     kubernetes.Interface
	Dynamic    dynamic.Interface
	Mapper     meta.ResettableRESTMapper
	// Kubectl is the kubectl used for exec (default: kubectl from PATH).
	Kubectl string
}

// Connect builds clients from kubeconfig; empty means $KUBECONFIG, else the local
// cluster's admin kubeconfig.
func Connect(kubeconfig string) (*Cluster, error) {
	if kubeconfig == "" {
		kubeconfig = os.Getenv("KUBECONFIG")
	}
	if kubeconfig == "" {
		kubeconfig = DefaultKubeconfig
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("load kubeconfig %s: %w", kubeconfig, err)
	}
	cfg.QPS, cfg.Burst = 100, 200
	cfg.UserAgent = "gpu-dra-demo"
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		kubectl = "kubectl"
	}
	return &Cluster{
		Kubeconfig: kubeconfig,
		Config:     cfg,
		Client:     client,
		Dynamic:    dyn,
		Mapper:     restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(client.Discovery())),
		Kubectl:    kubectl,
	}, nil
}

// Apply creates or updates obj with server-side apply.
func (c *Cluster) Apply(ctx context.Context, obj *unstructured.Unstructured) error {
	gvk := obj.GroupVersionKind()
	mapping, err := c.Mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		c.Mapper.Reset()
		if mapping, err = c.Mapper.RESTMapping(gvk.GroupKind(), gvk.Version); err != nil {
			return fmt.Errorf("%s %s: %w", gvk.Kind, obj.GetName(), err)
		}
	}
	data, err := obj.MarshalJSON()
	if err != nil {
		return err
	}
	var ri dynamic.ResourceInterface = c.Dynamic.Resource(mapping.Resource)
	if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
		ri = c.Dynamic.Resource(mapping.Resource).Namespace(obj.GetNamespace())
	}
	_, err = ri.Patch(ctx, obj.GetName(), types.ApplyPatchType, data,
		metav1.PatchOptions{FieldManager: FieldManager, Force: new(true)})
	if err != nil {
		return fmt.Errorf("apply %s %s: %w", gvk.Kind, objectName(obj), err)
	}
	return nil
}

// Exec runs a command in a container with kubectl exec and returns its output.
func (c *Cluster) Exec(ctx context.Context, namespace, pod, container string, command ...string) (string, error) {
	args := []string{"--kubeconfig", c.Kubeconfig, "exec", "-n", namespace, pod, "-c", container, "--"}
	cmd := exec.CommandContext(ctx, c.Kubectl, append(args, command...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kubectl exec %s/%s -c %s: %w: %s", namespace, pod, container, err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

func objectName(obj *unstructured.Unstructured) string {
	if ns := obj.GetNamespace(); ns != "" {
		return ns + "/" + obj.GetName()
	}
	return obj.GetName()
}
