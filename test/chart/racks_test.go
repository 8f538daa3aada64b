package chart

import (
	"regexp"
	"testing"

	"github.com/gpu-dra/gpu-dra-driver/pkg/nvmlsim"
)

// simulateNodeMachines takes what the plugin's --simulate-node-machines
// takes for a node: every machine, and a rack (MACHINE@RACK[/CLIQUE]) on the
// machines with an NVLink fabric.
func TestSchemaSimulateNodeMachinesRacks(t *testing.T) {
	schema := loadSchema(t)
	node := schema["properties"].(map[string]any)["simulateNodeMachines"].(map[string]any)
	pattern := regexp.MustCompile(node["additionalProperties"].(map[string]any)["pattern"].(string))
	var names []string
	for _, m := range nvmlsim.Machines() {
		names = append(names, m, m+"@rack-a", m+"@rack-a/2", m+"@rack-a/0", m+"@", m+"@a b")
	}
	names = append(names, "gb300", "gb300@rack-a", "")
	for _, name := range names {
		schemaTakes, pluginTakes := pattern.MatchString(name), nvmlsim.CheckMachine(name) == nil
		if schemaTakes != pluginTakes {
			t.Errorf("machine %q: schema takes it %v, the plugin %v", name, schemaTakes, pluginTakes)
		}
	}
}
