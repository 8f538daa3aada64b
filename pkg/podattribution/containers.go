package podattribution

import (
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Consumer is a pod, and when known one of its containers, using a claim.
type Consumer struct {
	Pod       string
	PodUID    types.UID
	Container string
	// ContainerIDs are the runtime IDs the container has had, as far as
	// the pod's status told when it was last read.
	ContainerIDs []string
	// Requests, if set, limits the container to the devices allocated for
	// these requests of the claim; nil means the whole claim.
	Requests []string
}

// ContainerUse is one container of a pod that uses a ResourceClaim.
type ContainerUse struct {
	Container string
	// ContainerIDs are the runtime IDs of the container in the pod's
	// status (current and last terminated, without the "containerd://"
	// scheme); empty before it started.
	ContainerIDs []string
	// Requests, if set, limits the container to the devices allocated for
	// these requests of the claim (resources.claims[].request); nil means
	// the whole claim.
	Requests []string
}

// ClaimContainers maps the names of the ResourceClaims a pod uses to the
// containers (init and sidecar containers included) that use each. A claim
// is found through spec.resourceClaims: by resourceClaimName, or for a
// claim generated from a template, by the pod's
// status.resourceClaimStatuses entry. Claims the pod references but no
// container uses are left out.
func ClaimContainers(pod *corev1.Pod) map[string][]ContainerUse {
	generated := map[string]string{}
	for _, st := range pod.Status.ResourceClaimStatuses {
		if st.ResourceClaimName != nil {
			generated[st.Name] = *st.ResourceClaimName
		}
	}
	// Pod-level claim name → ResourceClaim name.
	claimOf := map[string]string{}
	for _, pc := range pod.Spec.ResourceClaims {
		switch {
		case pc.ResourceClaimName != nil:
			claimOf[pc.Name] = *pc.ResourceClaimName
		case pc.ResourceClaimTemplateName != nil && generated[pc.Name] != "":
			claimOf[pc.Name] = generated[pc.Name]
		}
	}
	ids := containerIDs(pod)
	out := map[string][]ContainerUse{}
	for _, ctr := range slices.Concat(pod.Spec.InitContainers, pod.Spec.Containers) {
		for _, ref := range ctr.Resources.Claims {
			claim, ok := claimOf[ref.Name]
			if !ok {
				continue
			}
			out[claim] = addUse(out[claim], ctr.Name, ref.Request, ids[ctr.Name])
		}
	}
	return out
}

// containerIDs maps container names to the runtime IDs the pod's status
// gives them: the running one and the last terminated one.
func containerIDs(pod *corev1.Pod) map[string][]string {
	out := map[string][]string{}
	for _, st := range slices.Concat(pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses) {
		for _, id := range []string{st.ContainerID, lastTerminatedID(st)} {
			if _, bare, ok := strings.Cut(id, "://"); ok && bare != "" && !slices.Contains(out[st.Name], bare) {
				out[st.Name] = append(out[st.Name], bare)
			}
		}
	}
	return out
}

func lastTerminatedID(st corev1.ContainerStatus) string {
	if st.LastTerminationState.Terminated != nil {
		return st.LastTerminationState.Terminated.ContainerID
	}
	return ""
}

// addUse records that container uses request ("" for the whole claim),
// merging several references of one container to the same claim.
func addUse(uses []ContainerUse, container, request string, ids []string) []ContainerUse {
	i := slices.IndexFunc(uses, func(u ContainerUse) bool { return u.Container == container })
	if i < 0 {
		u := ContainerUse{Container: container, ContainerIDs: ids}
		if request != "" {
			u.Requests = []string{request}
		}
		return append(uses, u)
	}
	switch u := &uses[i]; {
	case u.Requests == nil: // already uses the whole claim
	case request == "":
		u.Requests = nil
	case !slices.Contains(u.Requests, request):
		u.Requests = append(u.Requests, request)
	}
	return uses
}

// Uses reports whether the consumer uses a device allocated for request. An allocation result of a
// prioritized-list request names the subrequest ("gpu/large"), containers
// name the request ("gpu"). A device without a recorded request is
// attributed to every container using the claim.
func (c Consumer) Uses(request string) bool {
	if c.Requests == nil || request == "" {
		return true
	}
	parent, _, _ := strings.Cut(request, "/")
	return slices.Contains(c.Requests, parent)
}
