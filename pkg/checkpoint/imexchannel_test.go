package checkpoint

import (
	"encoding/json"
	"testing"
)

// An IMEX channel record keeps the fields a newer release adds to it.
func TestIMEXChannelKeepsUnknownFields(t *testing.T) {
	in := `{"request":"channel","pool":"imex-channels.c.1","device":"channel-3","kind":"imex-channel",` +
		`"imexChannel":{"channel":3,"domainNamespace":"ml","domainName":"training","domainUID":"uid-1","daemonPort":50001}}`
	var pd PreparedDevice
	if err := json.Unmarshal([]byte(in), &pd); err != nil {
		t.Fatal(err)
	}
	c := pd.IMEXChannel
	if c == nil || c.Channel != 3 || c.DomainNamespace != "ml" || c.DomainName != "training" || c.DomainUID != "uid-1" {
		t.Fatalf("record %+v", c)
	}
	out, err := json.Marshal(pd)
	if err != nil {
		t.Fatal(err)
	}
	var back struct {
		IMEXChannel map[string]json.RawMessage `json:"imexChannel"`
	}
	if err := json.Unmarshal(out, &back); err != nil {
		t.Fatal(err)
	}
	if string(back.IMEXChannel["daemonPort"]) != "50001" {
		t.Errorf("written back %s: the unknown field daemonPort is lost", out)
	}
}
