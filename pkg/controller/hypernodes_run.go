package controller

import (
	"context"
	"fmt"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"

	"github.com/gpu-dra/gpu-dra-driver/pkg/controller/hypernodes"
	"github.com/gpu-dra/gpu-dra-driver/pkg/controller/nodelabels"
)

// dynamicClient returns cfg.DynamicClient, or one built like the typed
// client.
func dynamicClient(cfg *Config) (dynamic.Interface, error) {
	if cfg.DynamicClient != nil {
		return cfg.DynamicClient, nil
	}
	restConfig, err := cfg.Options.RESTConfig(cfg.RestConfig, userAgent)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(restConfig)
	if err != nil {
		return nil, fmt.Errorf("dynamic client: %w", err)
	}
	return dyn, nil
}

// hyperNodes builds the Volcano HyperNode controller (one HyperNode per
// NVLink clique): its run function and the node informer factory to start.
func hyperNodes(client kubernetes.Interface, cfg *Config) (func(context.Context) error, informers.SharedInformerFactory, error) {
	dyn, err := dynamicClient(cfg)
	if err != nil {
		return nil, nil, err
	}
	nodeFactory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTransform(nodelabels.StripNode))
	c, err := hypernodes.New(client.Discovery(), dyn, nodeFactory.Core().V1().Nodes(), hypernodes.Options{})
	if err != nil {
		return nil, nil, err
	}
	return c.Run, nodeFactory, nil
}
