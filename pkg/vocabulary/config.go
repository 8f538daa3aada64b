package vocabulary

import "strings"

// AppliesTo reports whether an opaque config naming requests applies to the
// allocation result of request: a config naming no request applies to all,
// and one naming request "req" applies to its subrequests "req/<sub>" (of a
// firstAvailable request) too.
func AppliesTo(requests []string, request string) bool {
	if len(requests) == 0 {
		return true
	}
	parent, _, _ := strings.Cut(request, "/")
	for _, r := range requests {
		if r == request || r == parent {
			return true
		}
	}
	return false
}
