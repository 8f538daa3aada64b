package v1beta1

import (
	"strings"
	"testing"
)

func TestComputeDomainChannelConfigDecode(t *testing.T) {
	for name, tc := range map[string]struct {
		doc  string
		want string // "" = valid; else a substring of the error
	}{
		"valid":         {`{"apiVersion":"gpu.dra.dev/v1beta1","kind":"ComputeDomainChannelConfig","domainName":"training"}`, ""},
		"no domain":     {`{"apiVersion":"gpu.dra.dev/v1beta1","kind":"ComputeDomainChannelConfig"}`, "domainName: Required value"},
		"bad domain":    {`{"apiVersion":"gpu.dra.dev/v1beta1","kind":"ComputeDomainChannelConfig","domainName":"Train_ing"}`, `domainName: Invalid value: "Train_ing"`},
		"unknown field": {`{"apiVersion":"gpu.dra.dev/v1beta1","kind":"ComputeDomainChannelConfig","domainName":"t","channel":3}`, "channel"},
	} {
		t.Run(name, func(t *testing.T) {
			cfg, err := DecodeDefaultValidate([]byte(tc.doc))
			if tc.want == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				if c, ok := cfg.(*ComputeDomainChannelConfig); !ok || c.DomainName != "training" {
					t.Fatalf("decoded %#v", cfg)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want it to contain %q", err, tc.want)
			}
		})
	}
}
