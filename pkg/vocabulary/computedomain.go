package vocabulary

import (
	"fmt"
	"strconv"
	"strings"
)

// Names of compute domains (multi-node NVLink, IMEX; docs/compute-domains.md).
//
// A clique's IMEX channels are published by the controller as one pool per
// NVLink clique, in slices whose node selector is the clique's node label, so
// a channel claim restricts its pods to the nodes of one clique. Every claim
// of a domain selects the channel number the controller reserved for the
// domain (AttrChannel == status.channel), which no other live domain holds.
// Each node's plugin prepares the channel for its pods and runs the domain's
// IMEX daemon.
const (
	// KindIMEXChannel is an IMEX channel of an NVLink clique.
	KindIMEXChannel Kind = "imex-channel"
	// AttrChannel is a channel device's channel number: the container gets
	// /dev/nvidia-caps-imex-channels/channel<N>.
	AttrChannel = "channel"
	// LabelClique is the node label holding the node's clique
	// ("<cluster UUID>.<clique ID>", the AttrCliqueID of its GPUs), set by
	// dra-controller from the node's slices; the channel slices select
	// nodes by it.
	LabelClique = DriverName + "/clique"
	// channelPoolPrefix starts the pool name of a clique's channels.
	channelPoolPrefix   = "imex-channels."
	channelDevicePrefix = "channel-"
)

// ChannelPoolName is the pool of the IMEX channels of a clique.
func ChannelPoolName(cliqueID string) string { return channelPoolPrefix + cliqueID }

// ChannelPoolClique returns the clique of a channel pool, and false for any
// other pool (a node's).
func ChannelPoolClique(pool string) (string, bool) {
	clique, ok := strings.CutPrefix(pool, channelPoolPrefix)
	return clique, ok && clique != ""
}

// ChannelDeviceName is the device name of channel n.
func ChannelDeviceName(n int) string { return channelDevicePrefix + strconv.Itoa(n) }

// ChannelDevNode is the device node of IMEX channel n, as the driver's
// nvidia-caps-imex-channels device makes it.
func ChannelDevNode(n int) string { return fmt.Sprintf("/dev/nvidia-caps-imex-channels/channel%d", n) }

// ChannelNumber parses a channel device's name.
func ChannelNumber(device string) (int, error) {
	s, ok := strings.CutPrefix(device, channelDevicePrefix)
	n, err := strconv.Atoi(s)
	if !ok || err != nil || n < 0 || strconv.Itoa(n) != s {
		return 0, fmt.Errorf("device %q is not an IMEX channel (want %s<N>)", device, channelDevicePrefix)
	}
	return n, nil
}

// CommonClique is the clique that the non-empty cliqueIDs of a node's GPUs
// agree on: "" and true when none has one, "" and false when they disagree
// (such a node belongs to no clique).
func CommonClique(ids ...string) (string, bool) {
	clique := ""
	for _, id := range ids {
		switch {
		case id == "":
		case clique == "":
			clique = id
		case clique != id:
			return "", false
		}
	}
	return clique, true
}
