// Package computedomain reconciles ComputeDomains (docs/compute-domains.md):
// it reserves each domain's channel number (status.channel, reserve.go),
// creates the domain's shared channel ResourceClaim or its claim template,
// owns the domain's status conditions (Ready, PodsScheduled), prunes node
// entries of nodes that no longer run the domain's pods, and deletes
// AfterLastPod domains after their last pod.
package computedomain

import (
	"encoding/json"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	gpuv1beta1 "github.com/gpu-dra/gpu-dra-driver/api/gpu/v1beta1"
	"github.com/gpu-dra/gpu-dra-driver/pkg/deviceclass"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// ChannelRequest is the request name of a domain's channel claim.
const ChannelRequest = "channel"

// ChannelClaim is the shared ResourceClaim of a domain's channel, named
// spec.channel.resourceClaimName in the domain's namespace and controlled
// by the domain: ChannelClaimSpec for the domain's channel number.
func ChannelClaim(cd *gpuv1beta1.ComputeDomain, driverName string, channel int32) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{
		ObjectMeta: ownedMeta(cd, cd.Spec.Channel.ResourceClaimName),
		Spec:       ChannelClaimSpec(cd, driverName, channel),
	}
}

// ChannelClaimTemplate is the ResourceClaimTemplate of a domain's channel
// (a claim per pod), named spec.channel.resourceClaimTemplateName in the
// domain's namespace and controlled by the domain: ChannelClaimSpec for
// the domain's channel number.
func ChannelClaimTemplate(cd *gpuv1beta1.ComputeDomain, driverName string, channel int32) *resourceapi.ResourceClaimTemplate {
	return &resourceapi.ResourceClaimTemplate{
		ObjectMeta: ownedMeta(cd, cd.Spec.Channel.ResourceClaimTemplateName),
		Spec:       resourceapi.ResourceClaimTemplateSpec{Spec: ChannelClaimSpec(cd, driverName, channel)},
	}
}

// ChannelClaimSpec is the spec of every channel claim of a domain: one
// request for channel number channel (the domain's status.channel) of the
// IMEX channel class, from any clique's pool, with the
// ComputeDomainChannelConfig naming the domain for the nodes' plugins.
func ChannelClaimSpec(cd *gpuv1beta1.ComputeDomain, driverName string, channel int32) resourceapi.ResourceClaimSpec {
	params, _ := json.Marshal(&gpuv1beta1.ComputeDomainChannelConfig{ // cannot fail
		TypeMeta:   metav1.TypeMeta{APIVersion: gpuv1beta1.GroupVersion.String(), Kind: gpuv1beta1.ComputeDomainChannelConfigKind},
		DomainName: cd.Name,
	})
	return resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
		Requests: []resourceapi.DeviceRequest{{
			Name: ChannelRequest,
			Exactly: &resourceapi.ExactDeviceRequest{
				DeviceClassName: deviceclass.IMEXChannel.Name(driverName),
				Selectors:       []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: ChannelSelector(driverName, channel)}}},
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
	}}
}

// ChannelSelector is the CEL selector of channel number channel.
func ChannelSelector(driverName string, channel int32) string {
	return fmt.Sprintf("device.attributes[%q].%s == %d", driverName, vocabulary.AttrChannel, channel)
}

// ownedMeta names an object of the domain's namespace that the domain
// controls, so that it goes with the domain.
func ownedMeta(cd *gpuv1beta1.ComputeDomain, name string) metav1.ObjectMeta {
	return metav1.ObjectMeta{
		Name:      name,
		Namespace: cd.Namespace,
		OwnerReferences: []metav1.OwnerReference{{
			APIVersion: gpuv1beta1.GroupVersion.String(), Kind: gpuv1beta1.ComputeDomainKind,
			Name: cd.Name, UID: cd.UID, Controller: ptr.To(true),
			// No blockOwnerDeletion: setting it needs update on computedomains/finalizers.
			BlockOwnerDeletion: ptr.To(false),
		}},
	}
}

var everything = labels.Everything()
