package computedomain

import (
	"context"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	gpuv1beta1 "github.com/gpu-dra/gpu-dra-driver/api/gpu/v1beta1"
	"github.com/gpu-dra/gpu-dra-driver/pkg/opaqueconfig"
)

// domainClaims are the channel claims of a domain, whose pods are the
// domain's: its shared claim, or in template mode its pods' own claims.
type domainClaims interface {
	// cached are the claims in the informer's cache.
	cached() []*resourceapi.ResourceClaim
	// live reads them from the API server; false when the API server
	// contradicts the cache so that nothing may be decided now (the
	// shared claim is gone or another).
	live(ctx context.Context) ([]*resourceapi.ResourceClaim, bool, error)
}

// sharedClaim is a shared-mode domain's one claim.
type sharedClaim struct {
	c     *Controller
	cd    *gpuv1beta1.ComputeDomain
	claim *resourceapi.ResourceClaim
}

func (s sharedClaim) cached() []*resourceapi.ResourceClaim {
	return []*resourceapi.ResourceClaim{s.claim}
}

func (s sharedClaim) live(ctx context.Context) ([]*resourceapi.ResourceClaim, bool, error) {
	claim, err := s.c.liveClaim(ctx, s.cd, s.claim)
	if claim == nil || err != nil {
		return nil, false, err
	}
	return []*resourceapi.ResourceClaim{claim}, true, nil
}

// templateClaims are a template-mode domain's claims: those of its
// namespace with the driver's ComputeDomainChannelConfig naming it, which
// its template's claims have (ChannelClaimSpec). A claim made by hand
// naming the domain counts too: the nodes join the domain's daemon for it.
type templateClaims struct {
	c  *Controller
	cd *gpuv1beta1.ComputeDomain
}

func (t templateClaims) cached() []*resourceapi.ResourceClaim {
	all, err := t.c.claims.ResourceClaims(t.cd.Namespace).List(everything)
	if err != nil {
		return nil
	}
	return t.of(all)
}

func (t templateClaims) live(ctx context.Context) ([]*resourceapi.ResourceClaim, bool, error) {
	list, err := t.c.client.ResourceV1().ResourceClaims(t.cd.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, false, fmt.Errorf("list the channel claims of ComputeDomain %s/%s: %w", t.cd.Namespace, t.cd.Name, err)
	}
	all := make([]*resourceapi.ResourceClaim, len(list.Items))
	for i := range list.Items {
		all[i] = &list.Items[i]
	}
	return t.of(all), true, nil
}

func (t templateClaims) of(all []*resourceapi.ResourceClaim) []*resourceapi.ResourceClaim {
	var out []*resourceapi.ResourceClaim
	for _, claim := range all {
		if channelDomain(claim, t.c.opts.DriverName) == t.cd.Name {
			out = append(out, claim)
		}
	}
	return out
}

// channelDomain is the domain a claim's channel config of the driver
// names, "" for none.
func channelDomain(claim *resourceapi.ResourceClaim, driverName string) string {
	for _, cfg := range claim.Spec.Devices.Config {
		if cfg.Opaque == nil || cfg.Opaque.Driver != driverName {
			continue
		}
		dec, err := opaqueconfig.DecodeDefaultValidate(cfg.Opaque.Parameters.Raw)
		if ch, ok := dec.(*gpuv1beta1.ComputeDomainChannelConfig); err == nil && ok {
			return ch.DomainName
		}
	}
	return ""
}

// podsOf are the pods the claims are reserved for.
func podsOf(claims ...*resourceapi.ResourceClaim) []resourceapi.ResourceClaimConsumerReference {
	var pods []resourceapi.ResourceClaimConsumerReference
	for _, claim := range claims {
		for _, r := range claim.Status.ReservedFor {
			if r.APIGroup == "" && r.Resource == "pods" {
				pods = append(pods, r)
			}
		}
	}
	return pods
}
