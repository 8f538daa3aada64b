// Package cliflags holds flag conventions shared by the project's commands.
package cliflags

import (
	"fmt"
	"os"
	"strings"

	"github.com/spf13/pflag"
)

// EnvName is the environment twin of a flag: "cdi-dir" → "CDI_DIR".
func EnvName(flag string) string {
	return strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// ApplyEnv sets every flag not given on the command line from its
// environment twin, so a DaemonSet can configure the binary with env vars
// (e.g. NODE_NAME from the downward API). Command-line flags win.
func ApplyEnv(fs *pflag.FlagSet, lookup func(string) (string, bool)) error {
	if lookup == nil {
		lookup = os.LookupEnv
	}
	var errs []string
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Changed {
			return
		}
		value, ok := lookup(EnvName(f.Name))
		if !ok {
			return
		}
		if err := fs.Set(f.Name, value); err != nil {
			errs = append(errs, fmt.Sprintf("environment variable %s for --%s: %v", EnvName(f.Name), f.Name, err))
		}
	})
	if len(errs) > 0 {
		return fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return nil
}

// AddEnvToUsage appends the environment twin to each flag's help text.
func AddEnvToUsage(fs *pflag.FlagSet) {
	fs.VisitAll(func(f *pflag.Flag) {
		if !strings.Contains(f.Usage, "[$") {
			f.Usage = fmt.Sprintf("%s [$%s]", f.Usage, EnvName(f.Name))
		}
	})
}
