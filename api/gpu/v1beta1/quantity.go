package v1beta1

import (
	"bytes"
	"encoding/json"
	"math"
	"regexp"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation/field"
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

// unsafeQuantities walks every token of a JSON document, duplicates
// included, and reports each value at a quantity path that is too long or
// has too large a decimal exponent to be parsed safely.
func unsafeQuantities(jsonData []byte) field.ErrorList {
	dec := json.NewDecoder(bytes.NewReader(jsonData))
	dec.UseNumber()
	var errs field.ErrorList
	// The document already parsed as JSON; a token error can only end the
	// walk early.
	_ = walkJSON(dec, nil, func(path []string, value any) {
		if !isQuantityField(path) {
			return
		}
		var s string
		switch v := value.(type) {
		case string:
			s = v
		case json.Number:
			s = v.String()
		default:
			return // null, bool: the decoder reports those itself
		}
		if !safeQuantity(s) {
			p := field.NewPath(path[0], path[1], path[2])
			if len(path) == 4 {
				p = p.Key(path[3])
			}
			errs = append(errs, field.Invalid(p, s, "must be a quantity of bytes such as 512Mi or 16Gi, "+
				"at most 64 characters long and with a decimal exponent from e-30 to e30"))
		}
	})
	return errs
}

// walkJSON reads one value from dec and calls visit for every scalar in it
// with the path of object keys that leads there ("[]" for array elements).
func walkJSON(dec *json.Decoder, path []string, visit func([]string, any)) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	switch tok {
	case json.Delim('{'):
		for dec.More() {
			key, err := dec.Token()
			if err != nil {
				return err
			}
			k, _ := key.(string)
			if err := walkJSON(dec, append(path[:len(path):len(path)], k), visit); err != nil {
				return err
			}
		}
		_, err = dec.Token() // '}'
		return err
	case json.Delim('['):
		for dec.More() {
			if err := walkJSON(dec, append(path[:len(path):len(path)], "[]"), visit); err != nil {
				return err
			}
		}
		_, err = dec.Token() // ']'
		return err
	default:
		visit(path, tok)
		return nil
	}
}

func isQuantityField(path []string) bool {
	for _, want := range quantityFields {
		if len(path) != len(want) {
			continue
		}
		match := true
		for i := range want {
			if want[i] != "*" && want[i] != path[i] {
				match = false
				break
			}
		}
		if match {
			return true
		}
	}
	return false
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
