package quorumlock

import "github.com/quorumlock/quorumlock/internal/testhook"

// The hooks verify/ uses to inject faults that need more than the public
// API (internal/testhook).
func init() {
	testhook.SetTransferLeadership(func(n any, to uint64) bool {
		node, ok := n.(*Node)
		if !ok || node == nil {
			return false
		}
		r := node.raftReady.Load()
		if r == nil {
			return false
		}
		select {
		case <-node.closed:
			return false
		default:
		}
		r.TransferLeadership(to)
		return true
	})
	testhook.SetFailpointSetter(func(cfg any, f func(point string)) bool {
		c, ok := cfg.(*Config)
		if !ok || c == nil {
			return false
		}
		c.failpoint = f
		return true
	})
}
