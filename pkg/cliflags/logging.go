package cliflags

import (
	"github.com/spf13/pflag"

	"k8s.io/component-base/featuregate"
	"k8s.io/component-base/logs"
	logsapi "k8s.io/component-base/logs/api/v1"
	_ "k8s.io/component-base/logs/json/register" // --logging-format=json
)

// Logging is component-base logging (-v, --vmodule, --logging-format
// text|json) plus the --feature-gates that control it.
type Logging struct {
	config *logsapi.LoggingConfiguration
	gates  featuregate.MutableVersionedFeatureGate
}

// AddLoggingFlags registers the logging flags on fs.
func AddLoggingFlags(fs *pflag.FlagSet) *Logging {
	l := &Logging{config: logsapi.NewLoggingConfiguration(), gates: featuregate.NewFeatureGate()}
	if err := logsapi.AddFeatureGates(l.gates); err != nil {
		panic(err) // only on duplicate registration: a programming error
	}
	logsapi.AddFlags(l.config, fs)
	l.gates.AddFlag(fs)
	return l
}

// Apply validates the flags and configures klog; call it after parsing.
// The returned function flushes the logs.
func (l *Logging) Apply() (func(), error) {
	logs.InitLogs()
	if err := logsapi.ValidateAndApply(l.config, l.gates); err != nil {
		return func() {}, err
	}
	return logs.FlushLogs, nil
}
