package checkpoint

import (
	"encoding/json"
	"reflect"
	"strings"
)

// Fields this release does not know are kept, not dropped: a newer release
// may have recorded in them what it needs to undo its work, and this
// release rewrites the whole file on every change. Each record type holds
// them in Unknown, reads them with splitUnknown and writes them back with
// joinUnknown. Unknown top-level fields of the file's envelope are not kept.

// Unknown holds the JSON fields of a record that this release does not know,
// verbatim.
type Unknown map[string]json.RawMessage

// knownNames returns the JSON field names of struct type t.
func knownNames(t reflect.Type) map[string]bool {
	names := map[string]bool{}
	for i := range t.NumField() {
		tag := t.Field(i).Tag.Get("json")
		name, _, _ := strings.Cut(tag, ",")
		if name != "" && name != "-" {
			names[name] = true
		}
	}
	return names
}

// splitUnknown returns the fields of the JSON object data not in known.
func splitUnknown(data []byte, known map[string]bool) (Unknown, error) {
	var all map[string]json.RawMessage
	if err := json.Unmarshal(data, &all); err != nil {
		return nil, err
	}
	var out Unknown
	for k, v := range all {
		if !known[k] {
			if out == nil {
				out = Unknown{}
			}
			out[k] = v
		}
	}
	return out, nil
}

// joinUnknown adds the unknown fields to the JSON object data; a known
// field of the same name wins.
func joinUnknown(data []byte, unknown Unknown) ([]byte, error) {
	if len(unknown) == 0 {
		return data, nil
	}
	var all map[string]json.RawMessage
	if err := json.Unmarshal(data, &all); err != nil {
		return nil, err
	}
	for k, v := range unknown {
		if _, ok := all[k]; !ok {
			all[k] = v
		}
	}
	return json.Marshal(all)
}

// The record types without their JSON methods, and their known fields.
type (
	checkpointFields     Checkpoint
	preparedClaimFields  PreparedClaim
	preparedDeviceFields PreparedDevice
	migInstanceFields    MigInstance
	sharingFields        Sharing
	imexChannelFields    IMEXChannel
)

var (
	checkpointNames     = knownNames(reflect.TypeFor[Checkpoint]())
	preparedClaimNames  = knownNames(reflect.TypeFor[PreparedClaim]())
	preparedDeviceNames = knownNames(reflect.TypeFor[PreparedDevice]())
	migInstanceNames    = knownNames(reflect.TypeFor[MigInstance]())
	sharingNames        = knownNames(reflect.TypeFor[Sharing]())
	imexChannelNames    = knownNames(reflect.TypeFor[IMEXChannel]())
)

// UnmarshalJSON keeps unknown fields.
func (c *Checkpoint) UnmarshalJSON(data []byte) error {
	if err := json.Unmarshal(data, (*checkpointFields)(c)); err != nil {
		return err
	}
	u, err := splitUnknown(data, checkpointNames)
	c.Unknown = u
	return err
}

// MarshalJSON writes unknown fields back.
func (c Checkpoint) MarshalJSON() ([]byte, error) {
	data, err := json.Marshal(checkpointFields(c))
	if err != nil {
		return nil, err
	}
	return joinUnknown(data, c.Unknown)
}

// UnmarshalJSON keeps unknown fields.
func (c *PreparedClaim) UnmarshalJSON(data []byte) error {
	if err := json.Unmarshal(data, (*preparedClaimFields)(c)); err != nil {
		return err
	}
	u, err := splitUnknown(data, preparedClaimNames)
	c.Unknown = u
	return err
}

// MarshalJSON writes unknown fields back.
func (c PreparedClaim) MarshalJSON() ([]byte, error) {
	data, err := json.Marshal(preparedClaimFields(c))
	if err != nil {
		return nil, err
	}
	return joinUnknown(data, c.Unknown)
}

// UnmarshalJSON keeps unknown fields.
func (d *PreparedDevice) UnmarshalJSON(data []byte) error {
	if err := json.Unmarshal(data, (*preparedDeviceFields)(d)); err != nil {
		return err
	}
	u, err := splitUnknown(data, preparedDeviceNames)
	d.Unknown = u
	return err
}

// MarshalJSON writes unknown fields back.
func (d PreparedDevice) MarshalJSON() ([]byte, error) {
	data, err := json.Marshal(preparedDeviceFields(d))
	if err != nil {
		return nil, err
	}
	return joinUnknown(data, d.Unknown)
}

// UnmarshalJSON keeps unknown fields.
func (m *MigInstance) UnmarshalJSON(data []byte) error {
	if err := json.Unmarshal(data, (*migInstanceFields)(m)); err != nil {
		return err
	}
	u, err := splitUnknown(data, migInstanceNames)
	m.Unknown = u
	return err
}

// MarshalJSON writes unknown fields back.
func (m MigInstance) MarshalJSON() ([]byte, error) {
	data, err := json.Marshal(migInstanceFields(m))
	if err != nil {
		return nil, err
	}
	return joinUnknown(data, m.Unknown)
}

// UnmarshalJSON keeps unknown fields.
func (s *Sharing) UnmarshalJSON(data []byte) error {
	if err := json.Unmarshal(data, (*sharingFields)(s)); err != nil {
		return err
	}
	u, err := splitUnknown(data, sharingNames)
	s.Unknown = u
	return err
}

// MarshalJSON writes unknown fields back.
func (s Sharing) MarshalJSON() ([]byte, error) {
	data, err := json.Marshal(sharingFields(s))
	if err != nil {
		return nil, err
	}
	return joinUnknown(data, s.Unknown)
}

// UnmarshalJSON keeps unknown fields.
func (c *IMEXChannel) UnmarshalJSON(data []byte) error {
	if err := json.Unmarshal(data, (*imexChannelFields)(c)); err != nil {
		return err
	}
	u, err := splitUnknown(data, imexChannelNames)
	c.Unknown = u
	return err
}

// MarshalJSON writes unknown fields back.
func (c IMEXChannel) MarshalJSON() ([]byte, error) {
	data, err := json.Marshal(imexChannelFields(c))
	if err != nil {
		return nil, err
	}
	return joinUnknown(data, c.Unknown)
}
