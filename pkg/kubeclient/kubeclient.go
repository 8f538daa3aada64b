// Package kubeclient builds the API client of the project's binaries from
// their --kubeconfig, --kube-api-qps and --kube-api-burst flags.
package kubeclient

import (
	"fmt"

	"github.com/spf13/pflag"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Options are the API client settings a binary takes on its command line.
type Options struct {
	// Kubeconfig is a kubeconfig file; empty means the in-cluster
	// configuration.
	Kubeconfig string
	// KubeAPIQPS and KubeAPIBurst, when positive, replace client-go's
	// rate limits (5 and 10).
	KubeAPIQPS   float32
	KubeAPIBurst int
}

// AddFlags registers --kubeconfig, --kube-api-qps and --kube-api-burst on
// fs with the binary's defaults; qpsUsage says why its QPS is what it is.
func (o *Options) AddFlags(fs *pflag.FlagSet, qps float32, burst int, qpsUsage string) {
	fs.StringVar(&o.Kubeconfig, "kubeconfig", "", "Path to a kubeconfig; in-cluster configuration when empty.")
	fs.Float32Var(&o.KubeAPIQPS, "kube-api-qps", qps, qpsUsage)
	fs.IntVar(&o.KubeAPIBurst, "kube-api-burst", burst, "API client burst.")
}

// New returns a client identified as userAgent. base, when set, is used
// instead of the configuration o.Kubeconfig names (tests, integration
// tests against a real API server); it is not modified.
func (o Options) New(base *rest.Config, userAgent string) (kubernetes.Interface, error) {
	restConfig, err := o.RESTConfig(base, userAgent)
	if err != nil {
		return nil, err
	}
	client, err := kubernetes.NewForConfig(restConfig)
	if err != nil {
		return nil, fmt.Errorf("create API client: %w", err)
	}
	return client, nil
}

// RESTConfig is the configuration New builds its client from: a copy of
// base, or what o.Kubeconfig names, or the in-cluster one, with o's rate
// limits and userAgent.
func (o Options) RESTConfig(base *rest.Config, userAgent string) (*rest.Config, error) {
	var c *rest.Config
	var err error
	switch {
	case base != nil:
		c = rest.CopyConfig(base)
	case o.Kubeconfig != "":
		if c, err = clientcmd.BuildConfigFromFlags("", o.Kubeconfig); err != nil {
			return nil, fmt.Errorf("load kubeconfig %q: %w", o.Kubeconfig, err)
		}
	default:
		if c, err = rest.InClusterConfig(); err != nil {
			return nil, fmt.Errorf("in-cluster API client configuration (no --kubeconfig given): %w", err)
		}
	}
	if o.KubeAPIQPS > 0 {
		c.QPS = o.KubeAPIQPS
	}
	if o.KubeAPIBurst > 0 {
		c.Burst = o.KubeAPIBurst
	}
	c.UserAgent = userAgent
	return c, nil
}
