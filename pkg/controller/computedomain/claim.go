// Package computedomain reconciles ComputeDomains (docs/compute-domains.md):
// it creates each domain's shared channel ResourceClaim, owns the domain's
// status conditions (Ready, PodsScheduled), prunes node entries of nodes
// that no longer run the domain's pods, and deletes AfterLastPod domains
// after their last pod.
package computedomain

import (
	"encoding/json"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	gpuv1beta1 "github.com/gpu-dra/gpu-dra-driver/api/gpu/v1beta1"
	"github.com/gpu-dra/gpu-dra-driver/pkg/deviceclass"
)

// ChannelRequest is the request name of a domain's channel claim.
const ChannelRequest = "channel"

// ChannelClaim is the shared ResourceClaim of a domain's channel, named
// spec.channel.resourceClaimName in the domain's namespace and controlled
// by the domain: one request for one IMEX channel, with the
// ComputeDomainChannelConfig naming the domain for the nodes' plugins.
func ChannelClaim(cd *gpuv1beta1.ComputeDomain, driverName string) *resourceapi.ResourceClaim {
	params, _ := json.Marshal(&gpuv1beta1.ComputeDomainChannelConfig{ // cannot fail
		TypeMeta:   metav1.TypeMeta{APIVersion: gpuv1beta1.GroupVersion.String(), Kind: gpuv1beta1.ComputeDomainChannelConfigKind},
		DomainName: cd.Name,
	})
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{
			Name:      cd.Spec.Channel.ResourceClaimName,
			Namespace: cd.Namespace,
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: gpuv1beta1.GroupVersion.String(), Kind: gpuv1beta1.ComputeDomainKind,
				Name: cd.Name, UID: cd.UID, Controller: ptr.To(true),
				// No blockOwnerDeletion: setting it needs update on computedomains/finalizers.
				BlockOwnerDeletion: ptr.To(false),
			}},
		},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{
				Name: ChannelRequest,
				Exactly: &resourceapi.ExactDeviceRequest{
					DeviceClassName: deviceclass.IMEXChannel.Name(driverName),
					AllocationMode:  resourceapi.DeviceAllocationModeExactCount,
					Count:           1,
				},
			}},
			Config: []resourceapi.DeviceClaimConfiguration{{
				Requests: []string{ChannelRequest},
				DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
					Driver: driverName, Parameters: runtime.RawExtension{Raw: params},
				}},
			}},
		}},
	}
}

var everything = labels.Everything()
