package nvmlsim

import (
	"fmt"
	"strconv"
	"strings"
)

// Racks: the GPUs of a multi-node NVLink rack (GB200 NVL72: 18 compute trays of 4 GPUs) share one
// NVLink fabric. NVML reports it per GPU through GetGpuFabricInfo: every GPU of the rack gives the
// same cluster UUID, and the NVLink partition the fabric manager put it in as its clique ID. A
// simulated tray learns its rack from its machine name, "MACHINE@RACK" or "MACHINE@RACK/CLIQUE"
// (gb200nvl72@rack-a, gb200nvl72@rack-a/2): every machine named with the same rack reports the
// same cluster UUID, and the same clique ID unless one is given (default 1). Without a rack a
// tray is a rack of its own, its cluster UUID derived from its seed like any other machine's. The
// name with the rack is what --simulate and --simulate-node-machines take, so the rack reaches
// every process that simulates the node.

// defaultClique is the clique ID of a rack's trays when the machine name gives none.
const defaultClique = 1

// rackRef is a machine name's rack part.
type rackRef struct {
	rack   string // "" when the machine names no rack
	clique uint32
}

// parseMachineName splits "MACHINE[@RACK[/CLIQUE]]".
func parseMachineName(name string) (string, rackRef, error) {
	base, rack, ok := strings.Cut(name, "@")
	if !ok {
		return name, rackRef{}, nil
	}
	spec, known := machines[base]
	if !known {
		return base, rackRef{}, nil // New reports the unknown machine
	}
	if !spec.nvlink.fabric {
		return base, rackRef{}, fmt.Errorf("machine %q: %s has no NVLink fabric, so it is in no rack", name, base)
	}
	ref := rackRef{rack: rack, clique: defaultClique}
	if r, clique, ok := strings.Cut(rack, "/"); ok {
		n, err := strconv.ParseUint(clique, 10, 32)
		if err != nil || n == 0 {
			return base, rackRef{}, fmt.Errorf("machine %q: clique %q: want a positive integer", name, clique)
		}
		ref.rack, ref.clique = r, uint32(n)
	}
	if ref.rack == "" || strings.ContainsAny(ref.rack, ",=@/ \t\n") {
		return base, rackRef{}, fmt.Errorf("machine %q: rack %q: want a non-empty name without , = @ / or spaces", name, ref.rack)
	}
	return base, ref, nil
}

// CheckMachine reports whether New accepts name: one of Machines(), optionally with a rack
// ("gb200nvl72@rack-a", "gb200nvl72@rack-a/2") when the machine has an NVLink fabric.
func CheckMachine(name string) error {
	base, _, err := parseMachineName(name)
	if err != nil {
		return err
	}
	if _, ok := machines[base]; !ok {
		return fmt.Errorf("unknown simulated machine %q, valid: %s (a machine with an NVLink fabric may add @RACK or @RACK/CLIQUE)", base, strings.Join(Machines(), ", "))
	}
	return nil
}

// fabricCluster is the cluster UUID and clique ID the machine's GPUs report.
func (m *Machine) fabricCluster() ([16]uint8, uint32) {
	if m.rack.rack != "" {
		return clusterUUID("rack:"+m.rack.rack, m.spec.name), m.rack.clique
	}
	return clusterUUID(m.seed, m.spec.name), defaultClique
}

// Rack returns the rack the machine was named with and its clique ID; "" and 0 when it is a rack
// of its own.
func (m *Machine) Rack() (string, uint32) {
	return m.rack.rack, m.rack.clique
}
