package kubelet

import (
	"context"
	"fmt"
	"net"
	"slices"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	resourceapi "k8s.io/api/resource/v1"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// PodResources serves the kubelet's PodResources v1 List on a unix
// socket, as the kubelet does on <root>/pod-resources/kubelet.sock: the
// containers of its running pods and the DRA claims each uses (with the
// devices the claim was prepared with, as the kubelet's DRA manager has
// them).
type PodResources struct {
	podresourcesv1.UnimplementedPodResourcesListerServer
	srv *grpc.Server

	mu   sync.Mutex
	pods []*podresourcesv1.PodResources
	err  error
}

// ServePodResources listens on socket until Stop.
func ServePodResources(socket string) (*PodResources, error) {
	l, err := net.Listen("unix", socket)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", socket, err)
	}
	p := &PodResources{srv: grpc.NewServer()}
	podresourcesv1.RegisterPodResourcesListerServer(p.srv, p)
	go func() { _ = p.srv.Serve(l) }()
	return p, nil
}

// Stop stops serving.
func (p *PodResources) Stop() { p.srv.Stop() }

// Run lists a pod whose container uses claim, with the claim's devices of
// driver; Stop ends it, as the kubelet drops a pod that ended.
func (p *PodResources) Run(pod, container string, claim *resourceapi.ResourceClaim, driver string) (stop func()) {
	dr := &podresourcesv1.DynamicResource{ClaimName: claim.Name, ClaimNamespace: claim.Namespace}
	if claim.Status.Allocation != nil {
		for _, r := range claim.Status.Allocation.Devices.Results {
			if r.Driver == driver {
				dr.ClaimResources = append(dr.ClaimResources, &podresourcesv1.ClaimResource{
					DriverName: r.Driver, PoolName: r.Pool, DeviceName: r.Device, ShareId: (*string)(r.ShareID),
				})
			}
		}
	}
	entry := &podresourcesv1.PodResources{Name: pod, Namespace: claim.Namespace, Containers: []*podresourcesv1.ContainerResources{
		{Name: container, DynamicResources: []*podresourcesv1.DynamicResource{dr}},
	}}
	p.mu.Lock()
	p.pods = append(p.pods, entry)
	p.mu.Unlock()
	return func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		p.pods = slices.DeleteFunc(p.pods, func(e *podresourcesv1.PodResources) bool { return e == entry })
	}
}

// Fail makes List fail with err until called with nil.
func (p *PodResources) Fail(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.err = err
}

// List implements podresourcesv1.PodResourcesListerServer.
func (p *PodResources) List(context.Context, *podresourcesv1.ListPodResourcesRequest) (*podresourcesv1.ListPodResourcesResponse, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err != nil {
		return nil, status.Error(codes.Unavailable, p.err.Error())
	}
	return &podresourcesv1.ListPodResourcesResponse{PodResources: slices.Clone(p.pods)}, nil
}
