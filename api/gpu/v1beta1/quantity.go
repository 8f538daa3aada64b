package v1beta1

import (
	"math"
	"regexp"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
)

// Quantities with extreme decimal exponents are a denial of service in
// k8s.io/apimachinery: resource.ParseQuantity("1e-999999999") does not
// return for minutes, and Quantity.Cmp on "1e999999999" neither. A pinned
// memory limit needs neither, so Decode rejects such quantities before the
// JSON decoder parses them, and Validate sizes quantities up cheaply before
// it compares them.
const (
	maxQuantityLength   = 64
	maxQuantityExponent = 30
)

// quantityFields are the paths of the quantities in a config, with "*" for
// any map key.
var quantityFields = [][]string{
	{"sharing", "mpsConfig", "defaultPinnedDeviceMemoryLimit"},
	{"sharing", "mpsConfig", "defaultPerDevicePinnedMemoryLimit", "*"},
}

// safeQuantity reports whether s can be handed to resource.ParseQuantity
// without risk: short, and any decimal exponent (e or E followed by a
// number; "Ei" and a bare "E" are binary and decimal suffixes) small.
// Anything else after an e or E is no quantity, and is rejected here too.
func safeQuantity(s string) bool {
	s = strings.TrimSpace(s)
	if len(s) > maxQuantityLength {
		return false
	}
	i := strings.IndexAny(s, "eE")
	if i < 0 || s[i+1:] == "" || s[i+1:] == "i" {
		return true
	}
	if !exponent.MatchString(s[i+1:]) {
		return false
	}
	exp, err := strconv.Atoi(s[i+1:])
	return err == nil && exp >= -maxQuantityExponent && exp <= maxQuantityExponent
}

var exponent = regexp.MustCompile(`^[+-]?[0-9]{1,3}$`)

// log10Bounds returns bounds lo <= log10(|q|) < hi without rescaling q,
// which would be slow for an extreme exponent. q must not be zero.
func log10Bounds(q resource.Quantity) (lo, hi float64) {
	d := q.AsDec() // q is a copy; AsDec at most converts the copy
	bits := float64(d.UnscaledBig().BitLen())
	scale := float64(d.Scale())
	return (bits-1)*math.Log10(2) - scale, bits*math.Log10(2) - scale
}
