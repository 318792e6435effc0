package quorumlock

// ReviewNSizes reports the sizes of what a Node or Client keeps per
// session, per call and per replica, for review N's long-run checks
// (review_n_test.go). o is a *Node or a *Client.
func ReviewNSizes(o any) map[string]int {
	out := map[string]int{}
	streams := func(ka map[string]*kaStream, ps map[string]*propStream) {
		out["ka streams"], out["propose streams"] = len(ka), len(ps)
		for _, k := range ka {
			k.mu.Lock()
			out["ka waiters"] += len(k.waiters)
			k.mu.Unlock()
		}
		for _, p := range ps {
			p.mu.Lock()
			out["propose waiters"] += len(p.waiters)
			out["propose queue"] += len(p.queue)
			p.mu.Unlock()
		}
	}
	var hb *heartbeater
	switch v := o.(type) {
	case *Node:
		hb = v.hb
		r := v.router
		r.mu.Lock()
		ka, ps := map[string]*kaStream{}, map[string]*propStream{}
		for id, k := range r.cm.ka {
			ka[v.cfg.Peers[id]] = k
		}
		for id, p := range r.cm.ps {
			ps[v.cfg.Peers[id]] = p
		}
		out["conns"] = len(r.cm.conns)
		r.mu.Unlock()
		streams(ka, ps)
	case *Client:
		hb = v.hb
		v.mu.Lock()
		out["conns"], out["away"] = len(v.cm.conns), len(v.away)
		ka, ps := map[string]*kaStream{}, map[string]*propStream{}
		for a, k := range v.cm.ka {
			ka[a] = k
		}
		for a, p := range v.cm.ps {
			ps[a] = p
		}
		v.mu.Unlock()
		streams(ka, ps)
	}
	hb.mu.Lock()
	out["heartbeated sessions"] = len(hb.sessions)
	hb.mu.Unlock()
	return out
}
