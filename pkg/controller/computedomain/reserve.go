package computedomain

import (
	"context"
	"fmt"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	gpuv1beta1 "github.com/gpu-dra/gpu-dra-driver/api/gpu/v1beta1"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// noChannelRecheck is when to look again for a free channel number: a
// domain that goes away sends no event to the domains waiting for one.
const noChannelRecheck = 30 * time.Second

// reserveChannel returns the domain's channel number (status.channel),
// reserving it when unset: the number an allocated shared claim of the
// domain already holds (a domain from before channel numbers; the claim
// read from the API server), else the
// smallest number below Options.Channels that no other domain's
// status.channel holds. Channel devices may be allocated many times
// (allowMultipleAllocations), so this reservation, not the allocator, keeps
// two live domains off one channel.
//
// The other domains are read from the API server, not the cache, so a new
// leader whose cache lags cannot hand out a number twice; the write's
// precondition is the resource version of cd as read, so a status.channel
// written meanwhile (by a previous leader) fails it. Within the process,
// reserveMu serialises the read and the write. It returns nil, nil when no
// number is free, after setting Ready False (ReasonNoFreeChannel).
func (c *Controller) reserveChannel(ctx context.Context, cd *gpuv1beta1.ComputeDomain, u *unstructured.Unstructured, shared *resourceapi.ResourceClaim) (*int32, error) {
	if cd.Status.Channel != nil {
		return cd.Status.Channel, nil
	}
	c.reserveMu.Lock()
	defer c.reserveMu.Unlock()
	logger := klog.FromContext(ctx)
	if shared != nil { // adopt from the API server's claim: the cache may not show its allocation yet
		live, err := c.client.ResourceV1().ResourceClaims(shared.Namespace).Get(ctx, shared.Name, metav1.GetOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("read channel claim %s/%s for its channel: %w", shared.Namespace, shared.Name, err)
		}
		shared = live
		if err != nil || !metav1.IsControlledBy(live, cd) {
			shared = nil
		}
	}
	channel, adopted := allocatedChannel(shared, c.opts.DriverName)
	if !adopted {
		used, err := c.usedChannels(ctx, cd)
		if err != nil {
			return nil, err
		}
		free := int32(-1)
		for k := range int32(c.opts.Channels) {
			if !used.Has(k) {
				free = k
				break
			}
		}
		if free < 0 {
			logger.Info("No free IMEX channel number for ComputeDomain", "domain", klog.KObj(cd), "channels", c.opts.Channels)
			return nil, c.setConditions(ctx, cd, u, notReady(ReasonNoFreeChannel, fmt.Sprintf(
				"all %d IMEX channel numbers are held by other ComputeDomains; waiting for one to end (the chart's controller.computeDomains.imexChannelsPerClique raises the limit)",
				c.opts.Channels)))
		}
		channel = free
	}
	next := u.DeepCopy()
	if err := unstructured.SetNestedField(next.Object, int64(channel), "status", "channel"); err != nil {
		return nil, err
	}
	// UpdateStatus sends next's resourceVersion: the precondition.
	if _, err := c.domains.Namespace(cd.Namespace).UpdateStatus(ctx, next, metav1.UpdateOptions{FieldManager: FieldManager}); err != nil {
		return nil, fmt.Errorf("reserve IMEX channel %d in status.channel of ComputeDomain %s/%s: %w", channel, cd.Namespace, cd.Name, err)
	}
	logger.Info("Reserved IMEX channel for ComputeDomain", "domain", klog.KObj(cd), "channel", channel, "adopted", adopted)
	cd.Status.Channel = ptr.To(channel)
	return cd.Status.Channel, nil
}

// usedChannels are the channel numbers other domains hold, read from the
// API server. A domain being deleted still holds its number: its pods may
// still run.
func (c *Controller) usedChannels(ctx context.Context, cd *gpuv1beta1.ComputeDomain) (sets.Set[int32], error) {
	list, err := c.domains.List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list ComputeDomains for their channels: %w", err)
	}
	used := sets.New[int32]()
	for _, item := range list.Items {
		if item.GetUID() == cd.UID {
			continue
		}
		if k, ok, _ := unstructured.NestedInt64(item.Object, "status", "channel"); ok {
			used.Insert(int32(k))
		}
	}
	return used, nil
}

// allocatedChannel is the channel number of an allocated channel claim:
// its result from one of the driver's channel pools.
func allocatedChannel(claim *resourceapi.ResourceClaim, driverName string) (int32, bool) {
	if claim == nil || claim.Status.Allocation == nil {
		return 0, false
	}
	for _, r := range claim.Status.Allocation.Devices.Results {
		if _, ok := vocabulary.ChannelPoolClique(r.Pool); !ok || r.Driver != driverName {
			continue
		}
		if n, err := vocabulary.ChannelNumber(r.Device); err == nil {
			return int32(n), true
		}
	}
	return 0, false
}

// channelTemplate returns the domain's claim template, creating it for the
// domain's channel number when missing. It reads the API server: there is
// no template cache, and a template is read only on a domain's events.
func (c *Controller) channelTemplate(ctx context.Context, cd *gpuv1beta1.ComputeDomain, channel int32) (*resourceapi.ResourceClaimTemplate, error) {
	templates := c.client.ResourceV1().ResourceClaimTemplates(cd.Namespace)
	name := cd.Spec.Channel.ResourceClaimTemplateName
	tmpl, err := templates.Get(ctx, name, metav1.GetOptions{})
	if err == nil || !apierrors.IsNotFound(err) {
		if err != nil {
			return nil, fmt.Errorf("read channel claim template %s/%s: %w", cd.Namespace, name, err)
		}
		return tmpl, nil
	}
	tmpl, err = templates.Create(ctx, ChannelClaimTemplate(cd, c.opts.DriverName, channel), metav1.CreateOptions{FieldManager: FieldManager})
	if apierrors.IsAlreadyExists(err) {
		tmpl, err = templates.Get(ctx, name, metav1.GetOptions{})
	}
	if err != nil {
		return nil, fmt.Errorf("create channel claim template %s/%s: %w", cd.Namespace, name, err)
	}
	klog.FromContext(ctx).V(2).Info("Created channel claim template", "domain", klog.KObj(cd), "template", klog.KObj(tmpl), "channel", channel)
	return tmpl, nil
}
