package v1beta1

import (
	"bytes"
	"encoding/json"
	"fmt"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/util/validation/field"
)

// MaxConfigDepth is how deeply a config's objects and arrays may nest. The
// API's types nest four levels (the config, sharing, mpsConfig and a
// per-device map); the limit leaves room for a misplaced field to be
// reported as unknown rather than as too deep. Decode checks it before
// anything else walks the structure, so that no later step (the strict
// decoder, YAML conversion, quantity checks) costs more than linear time in
// the size of the config.
const MaxConfigDepth = 16

// checkUTF8 rejects input that is not valid UTF-8 and says where: the JSON
// decoder would silently replace such bytes with U+FFFD, and messages that
// quote the field would be garbled.
func checkUTF8(data []byte) error {
	if utf8.Valid(data) {
		return nil
	}
	for i := 0; i < len(data); {
		r, n := utf8.DecodeRune(data[i:])
		if r == utf8.RuneError && n <= 1 {
			return fmt.Errorf("config is not valid UTF-8: invalid byte 0x%02x at offset %d", data[i], i)
		}
		i += n
	}
	return nil // not reached: utf8.Valid found an invalid sequence
}

// frame is an open object or array of a JSON document, at the member it
// is reading: key (raw, quoted) in an object, index in an array.
type frame struct {
	object bool
	key    []byte
	index  int
}

// keyString unquotes a raw JSON key.
func keyString(raw []byte) string {
	if bytes.IndexByte(raw, '\\') < 0 {
		return string(raw[1 : len(raw)-1])
	}
	var k string
	_ = json.Unmarshal(raw, &k) // valid: the document parsed
	return k
}

// keyIs reports whether a raw JSON key is name, without allocating for the
// common key without escapes.
func keyIs(raw []byte, name string) bool {
	if bytes.IndexByte(raw, '\\') < 0 {
		return string(raw[1:len(raw)-1]) == name
	}
	return keyString(raw) == name
}

func fieldPath(path []frame) *field.Path {
	p := field.NewPath("")
	for i, f := range path {
		switch {
		case f.object && i == 0:
			p = field.NewPath(keyString(f.key))
		case f.object:
			p = p.Child(keyString(f.key))
		default:
			p = p.Index(f.index)
		}
	}
	return p
}

// scanJSON reads a valid JSON document once, byte by byte, duplicate keys
// included, and reports the first object or array nested deeper than
// MaxConfigDepth, with its path, and each value at a quantity path that
// is too long or has too large a decimal exponent to be parsed safely (see
// safeQuantity). It stops at the depth limit and allocates only for what
// it reports, so it is linear in the size of the document whatever its
// structure.
func scanJSON(data []byte) (tooDeep *field.Error, quantities field.ErrorList) {
	var (
		stack     []frame
		expectKey bool
		errs      field.ErrorList
	)
	for i := 0; i < len(data); {
		switch c := data[i]; c {
		case '{', '[':
			// The root is at depth 1: {"sharing":{...}} nests two levels.
			if len(stack) == MaxConfigDepth {
				return field.Forbidden(fieldPath(stack), fmt.Sprintf(
					"objects and arrays may nest at most %d levels deep (this API's types nest 4)", MaxConfigDepth)), errs
			}
			stack = append(stack, frame{object: c == '{'})
			expectKey = c == '{'
			i++
		case '}', ']':
			stack = stack[:len(stack)-1]
			expectKey = false
			i++
		case ',':
			if top := &stack[len(stack)-1]; top.object {
				expectKey = true
			} else {
				top.index++
			}
			i++
		case ' ', '\t', '\n', '\r', ':':
			i++
		case '"':
			end := i + 1
			for data[end] != '"' {
				if data[end] == '\\' {
					end++
				}
				end++
			}
			end++
			if expectKey {
				stack[len(stack)-1].key = data[i:end]
				expectKey = false
			} else if err := checkQuantity(stack, data[i:end]); err != nil {
				errs = append(errs, err)
			}
			i = end
		default: // a number, true, false or null
			end := i
			for end < len(data) && !endsScalar(data[end]) {
				end++
			}
			if err := checkQuantity(stack, data[i:end]); err != nil {
				errs = append(errs, err)
			}
			i = end
		}
	}
	return nil, errs
}

func endsScalar(c byte) bool {
	switch c {
	case ',', ']', '}', ' ', '\t', '\n', '\r':
		return true
	}
	return false
}

// checkQuantity checks a raw scalar at path if path is a quantity field.
func checkQuantity(path []frame, raw []byte) *field.Error {
	if !isQuantityField(path) {
		return nil
	}
	var q string
	switch raw[0] {
	case '"':
		q = keyString(raw)
	case 't', 'f', 'n':
		return nil // null, bool: the decoder reports those itself
	default:
		q = string(raw)
	}
	if safeQuantity(q) {
		return nil
	}
	p := field.NewPath(keyString(path[0].key), keyString(path[1].key), keyString(path[2].key))
	if len(path) == 4 {
		p = p.Key(keyString(path[3].key))
	}
	return field.Invalid(p, q, "must be a quantity of bytes such as 512Mi or 16Gi, "+
		"at most 64 characters long and with a decimal exponent from e-30 to e30")
}

// isQuantityField reports whether path leads to one of quantityFields.
func isQuantityField(path []frame) bool {
	for _, want := range quantityFields {
		if len(path) != len(want) {
			continue
		}
		match := true
		for i := range want {
			if !path[i].object || want[i] != "*" && !keyIs(path[i].key, want[i]) {
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
