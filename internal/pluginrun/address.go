package pluginrun

import "net"

// FreeAddress returns a local TCP address nothing listens on now, for a
// plugin's metrics or probe server.
func FreeAddress() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer func() { _ = l.Close() }()
	return l.Addr().String(), nil
}
