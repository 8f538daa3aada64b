// Package apiserver makes client-go's fake clientset behave like the API
// server where tests of the driver depend on it.
package apiserver

import (
	"fmt"
	"sync/atomic"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// GenerateNames makes client name objects created with generateName the way
// the API server does; the fake object tracker ignores generateName.
func GenerateNames(client *fake.Clientset) {
	var n atomic.Int64
	client.PrependReactor("create", "*", func(action k8stesting.Action) (bool, runtime.Object, error) {
		if obj, err := meta.Accessor(action.(k8stesting.CreateAction).GetObject()); err == nil && obj.GetName() == "" && obj.GetGenerateName() != "" {
			i := n.Add(1)
			obj.SetName(fmt.Sprintf("%s%05d", obj.GetGenerateName(), i))
			if obj.GetUID() == "" {
				obj.SetUID(types.UID(fmt.Sprintf("generated-uid-%05d", i)))
			}
		}
		return false, nil, nil
	})
}

// NodeClient returns a clientset holding the node and the claims that names
// objects created with generateName: what the kubelet plugin of that node
// reads and writes.
func NodeClient(node string, claims ...*resourceapi.ResourceClaim) *fake.Clientset {
	objs := []runtime.Object{&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, UID: "node-uid"}}}
	for _, c := range claims {
		objs = append(objs, c)
	}
	client := fake.NewClientset(objs...)
	GenerateNames(client)
	return client
}
