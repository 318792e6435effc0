package quorumlock

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/resolver"

	"github.com/quorumlock/quorumlock/clock"
	"github.com/quorumlock/quorumlock/internal/fsm"
	"github.com/quorumlock/quorumlock/internal/lockpb"
)

// Client reaches a lock cluster from a process that is not a replica, with
// the same Session, Lock and Leadership types as on a replica and the same
// client-side lease rule. It finds the leader, follows NOT_LEADER hints,
// moves to another replica when one is stopped, paused or cut off from the
// majority, and re-sends in-flight requests with their (session, seq).
// The heartbeats of all its sessions share one stream per replica (they go
// to the leader). Its methods are safe for concurrent use. On a nil or
// zero Client (the nil of a failed Dial) they do not panic: the calls that
// return an error return one wrapping ErrClosed (Close too), Observe's
// channel is closed and Status returns no entries.
//
// A Client does not know the replicas' Config.MaxNameBytes: it refuses
// locally only names no cluster accepts (empty, longer than
// MaxNameBytesLimit, not UTF-8, with NUL) and leaves the length bound to
// the cluster, which refuses a longer name with ErrInvalidName.
type Client struct {
	opts  clientOptions
	addrs []string

	mu sync.Mutex
	// The connections to the replicas, by address (guarded by mu).
	cm      connMaps[string]
	current int    // index in addrs of the replica tried first
	leader  string // last known leader address; "" if unknown
	// away holds, per address a request may be waiting at, a channel
	// closed (and dropped) when the client learns that another address
	// leads: a request stuck at a replica that is not the leader (the old
	// leader, or one tried while no leader was known) moves on. gRPC's
	// keepalive cannot notice a paused replica sooner than in 10-20 s.
	// Learning again the leader a call's timeout made the client forget
	// (rotate) closes nothing for that leader: the calls waiting at it
	// stay, and only those waiting elsewhere move.
	away map[string]chan struct{}

	hb        *heartbeater
	closed    chan struct{}
	closeOnce sync.Once
	baseCtx   context.Context
	cancel    context.CancelCauseFunc
}

// ClientOption configures Dial. A nil ClientOption is ignored, so options
// can be chosen conditionally.
type ClientOption func(*clientOptions)

type clientOptions struct {
	tls          *tls.Config
	dialer       func(ctx context.Context, addr string) (net.Conn, error)
	clk          clock.Clock
	ttl          time.Duration
	maxName      int
	settle       time.Duration
	attemptLimit time.Duration
}

// WithTLS makes the client use TLS (mutual, if cfg has certificates) on
// every connection. The default is plaintext.
func WithTLS(cfg *tls.Config) ClientOption { return func(o *clientOptions) { o.tls = cfg } }

// WithDialer sets the function that opens connections (the default dials
// TCP).
func WithDialer(d func(ctx context.Context, addr string) (net.Conn, error)) ClientOption {
	return func(o *clientOptions) { o.dialer = d }
}

// WithClock sets the clock of the client's leases. The default is
// clock.Real(); nil makes Dial return ErrInvalidConfig.
func WithClock(c clock.Clock) ClientOption { return func(o *clientOptions) { o.clk = c } }

// WithSessionTTL sets the TTL of sessions opened without WithTTL, in
// [MinSessionTTL, MaxSessionTTL] (Dial returns ErrInvalidConfig
// otherwise). The default is 10 s.
func WithSessionTTL(d time.Duration) ClientOption { return func(o *clientOptions) { o.ttl = d } }

// WithElectionTimeout tells the client the cluster's election timeout, used
// to bound the settling of an interrupted Acquire and each attempt of a
// request (twice the timeout). The default is 1 s; a value that is not
// positive makes Dial return ErrInvalidConfig.
func WithElectionTimeout(d time.Duration) ClientOption {
	return func(o *clientOptions) { o.settle = d }
}

// Dial returns a client of the cluster whose replicas serve on addrs (any
// subset works; more is more available), each "host:port" or a gRPC
// target with a scheme ("dns:///host:port", "unix:///path"), unless a
// WithDialer function, which may understand other forms, is given. It
// checks that one replica answers before returning, within ctx. Errors:
// ErrInvalidConfig for no addresses, an address or dns target without a
// port (gRPC would quietly dial port 443) or with a numeric port outside
// 0..65535, or bad options, ctx's error if
// ctx ends first, or the error of the last replica tried.
func Dial(ctx context.Context, addrs []string, opts ...ClientOption) (*Client, error) {
	ctx = orBackground(ctx)
	o := clientOptions{clk: clock.Real(), ttl: 10 * time.Second, maxName: MaxNameBytesLimit, settle: time.Second}
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	if len(addrs) == 0 {
		return nil, invalid("addrs", "at least one replica address is needed")
	}
	if o.dialer == nil {
		for _, a := range addrs {
			if err := checkAddr(a); err != nil {
				return nil, invalid("addrs", "%q: %v", a, err)
			}
		}
	}
	if o.ttl < MinSessionTTL || o.ttl > MaxSessionTTL {
		return nil, invalid("WithSessionTTL", "%v is outside [%v, %v]", o.ttl, MinSessionTTL, MaxSessionTTL)
	}
	if o.settle <= 0 {
		return nil, invalid("WithElectionTimeout", "%v must be positive", o.settle)
	}
	if o.clk == nil {
		return nil, invalid("WithClock", "nil clock")
	}
	o.attemptLimit = 2 * o.settle
	c := &Client{
		opts:   o,
		addrs:  append([]string(nil), addrs...),
		cm:     newConnMaps[string](),
		closed: make(chan struct{}),
	}
	c.baseCtx, c.cancel = context.WithCancelCause(context.Background())
	c.hb = newHeartbeater(c, o.clk, c.closed)
	var lastErr error
	for range addrs {
		addr := c.pick()
		cc, err := c.conn(addr)
		if err == nil {
			actx, cancel := context.WithTimeout(ctx, c.opts.attemptLimit)
			_, err = lockpb.NewLockClient(cc).Status(actx, &lockpb.StatusRequest{})
			cancel()
			if err == nil {
				c.hb.start()
				return c, nil
			}
		}
		lastErr = err
		c.rotate(addr)
		if ctx.Err() != nil {
			break
		}
	}
	c.closeConns()
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	return nil, fmt.Errorf("quorumlock: no replica answered: %w", lastErr)
}

// Close ends every session opened through the client locally (their Done
// and Lost channels close; the cluster frees their locks when their TTL
// runs out) and closes the connections. Idempotent; it returns nil.
func (c *Client) Close() error {
	if c.nilClient() {
		return errNoClient
	}
	c.closeOnce.Do(func() {
		close(c.closed)
		c.cancel(ErrClosed)
		c.hb.loseAll(ErrClosed)
		c.hb.wait()
		c.closeConns()
	})
	return nil
}

func (c *Client) isClosed() bool { return isDone(c.closed) }

func (c *Client) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(c.baseCtx, func() { cancel(ErrClosed) })
	return ctx, func() { stop(); cancel(nil) }
}

func (c *Client) ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		if cause := context.Cause(ctx); errors.Is(cause, ErrClosed) {
			return ErrClosed
		}
		return ctx.Err()
	}
	return err
}

// NewSession opens a session on the cluster. Options and errors as for
// Node.NewSession.
func (c *Client) NewSession(ctx context.Context, opts ...SessionOption) (*Session, error) {
	if c.nilClient() {
		return nil, errNoClient
	}
	ctx = orBackground(ctx)
	o, err := newSessionOptions(c.opts.ttl, opts)
	if err != nil {
		return nil, err
	}
	if c.isClosed() {
		return nil, ErrClosed
	}
	ctx, cancel := c.bound(ctx)
	defer cancel()
	s, err := openSession(ctx, c, c.cm.opens, c.hb, c.opts.clk, o.ttl, c.opts.maxName)
	if err != nil {
		return nil, c.ctxErr(ctx, err)
	}
	return s, nil
}

// Holder is Node.Holder through the client: a linearizable read served by
// a replica (the leader when known).
func (c *Client) Holder(ctx context.Context, name string) (LockInfo, error) {
	if c.nilClient() {
		return LockInfo{}, errNoClient
	}
	ctx = orBackground(ctx)
	if err := checkName(name, c.opts.maxName); err != nil {
		return LockInfo{}, err
	}
	resp, err := c.holder(ctx, name)
	if err != nil {
		return LockInfo{}, err
	}
	return LockInfo{Name: name, Holder: resp.GetSession(), Token: Token(resp.GetToken()), Waiters: resp.GetWaiters()}, nil
}

// Leader is Node.Leader through the client.
func (c *Client) Leader(ctx context.Context, role string) (LeaderInfo, error) {
	if c.nilClient() {
		return LeaderInfo{}, errNoClient
	}
	ctx = orBackground(ctx)
	if err := checkRole(role, c.opts.maxName); err != nil {
		return LeaderInfo{}, err
	}
	resp, err := c.holder(ctx, roleKey(role))
	if err != nil {
		return LeaderInfo{}, err
	}
	if resp.GetSession() == 0 {
		return LeaderInfo{Role: role}, fmt.Errorf("%w for %q", ErrNoLeader, role)
	}
	return LeaderInfo{Role: role, Session: resp.GetSession(), Epoch: Token(resp.GetToken()), Value: resp.GetValue()}, nil
}

// holder reads key from some replica, moving on from one that fails or
// hangs past the attempt limit.
func (c *Client) holder(ctx context.Context, key string) (*lockpb.HolderResponse, error) {
	if c.isClosed() {
		return nil, ErrClosed
	}
	ctx, cancel := c.bound(ctx)
	defer cancel()
	var resp *lockpb.HolderResponse
	err := c.retry(ctx, func(actx context.Context, cc *grpc.ClientConn) (bool, error) {
		r, err := lockpb.NewLockClient(cc).Holder(actx, &lockpb.HolderRequest{Name: key})
		if err != nil {
			return false, err
		}
		if r.GetCode() == lockpb.Code_CODE_INVALID {
			return true, fmt.Errorf("%w: %s (%s)", ErrInvalidName, keyLabel(key), r.GetMessage())
		}
		resp = r
		return true, nil
	})
	if err != nil {
		return nil, c.ctxErr(ctx, err)
	}
	return resp, nil
}

// retry runs one attempt per replica, starting with the leader when known,
// each bounded by the attempt limit, until an attempt is final or ctx ends.
func (c *Client) retry(ctx context.Context, attempt func(context.Context, *grpc.ClientConn) (final bool, err error)) error {
	backoff := minBackoff
	for {
		addr := c.pick()
		cc, err := c.conn(addr)
		if err == nil {
			actx, cancel := context.WithTimeout(ctx, c.opts.attemptLimit)
			sent := time.Now()
			var final bool
			final, err = attempt(actx, cc)
			c.cm.attemptEnded(&c.mu, c.hb, ctx, actx, addr, cc, sent)
			cancel()
			if final {
				return err
			}
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		c.rotate(addr)
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return ctx.Err()
		}
		backoff = min(backoff*2, backoffCap(c.opts.settle))
	}
}

// Observe is Node.Observe through the client. The stream is served by one
// replica at a time, the leader when known; when it fails, or the replica
// does not send the current state within twice the election timeout (it
// is cut off from the majority), the client resumes on another, starting
// again from a linearizable read. A replica cut off after it sent the
// current state is left only when the client learns of a new leader (from
// its sessions' heartbeats) or the connection fails: until then no change
// is reported. When the client learns of a leader other than the replica
// serving the stream, the stream moves to it at once; a restart starts
// again from the current state, so a leadership that began and ended
// during that one round trip can be missed (never reported out of order).
// The channel closes when ctx ends, the Client closes, or at once for an
// invalid role (also one the replicas refuse: longer than their
// MaxNameBytes and not held; see Config.MaxNameBytes).
func (c *Client) Observe(ctx context.Context, role string) <-chan LeaderInfo {
	ctx = orBackground(ctx)
	out := make(chan LeaderInfo)
	if c.nilClient() || checkRole(role, c.opts.maxName) != nil || c.isClosed() {
		close(out)
		return out
	}
	ctx, cancel := c.bound(ctx)
	src := make(chan fsm.LockInfo)
	go func() {
		defer close(src)
		backoff := minBackoff
		for ctx.Err() == nil {
			// Picked with its channel: a leader change between the two
			// would otherwise go unnoticed.
			addr, moved := c.pickWatch()
			if cc, err := c.conn(addr); err == nil {
				// Follow the leader: a stream from a replica that went
				// silent would otherwise hang until keepalive notices.
				// A stream already served by the new leader is kept:
				// every restart starts again from the current state, so
				// the changes made meanwhile are not reported.
				octx, cancel := context.WithCancel(ctx)
				var away atomic.Bool
				go func() {
					for m := moved; ; {
						select {
						case <-m:
							var still bool
							if m, still = c.rewatch(addr); !still {
								away.Store(true)
								cancel()
								return
							}
						case <-octx.Done():
							return
						}
					}
				}()
				refused := c.observeOnce(octx, cc, roleKey(role), src)
				cancel()
				if refused {
					// The cluster refuses the role (its MaxNameBytes is
					// below the client's): as Node.Observe does for an
					// invalid role, the stream closes.
					return
				}
				if away.Load() && ctx.Err() == nil {
					// Not a failure: go to the new leader at once,
					// keeping it as the leader (rotate would forget
					// it).
					backoff = minBackoff
					continue
				}
			}
			if ctx.Err() != nil {
				return
			}
			c.rotate(addr)
			select {
			case <-time.After(backoff):
			case <-ctx.Done():
			}
			backoff = min(backoff*2, backoffCap(c.opts.settle))
		}
	}()
	go func() {
		defer cancel()
		defer close(out)
		observe(ctx, role, src, out)
	}()
	return out
}

// observeOnce relays one Observe stream until it fails. The first message
// is the replica's linearizable read, which a replica cut off from the
// majority never sends: without it within the attempt limit the stream is
// given up, as Holder gives up an attempt. Later, a replica that has gone
// silent is detected by the connection's keepalive. It reports whether
// the replica refused the key as invalid.
func (c *Client) observeOnce(ctx context.Context, cc *grpc.ClientConn, key string, src chan<- fsm.LockInfo) (refused bool) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	first := time.AfterFunc(c.opts.attemptLimit, cancel)
	defer first.Stop()
	st, err := lockpb.NewLockClient(cc).Observe(sctx, &lockpb.HolderRequest{Name: key})
	if err != nil {
		return false
	}
	for {
		r, err := st.Recv()
		first.Stop()
		if err != nil {
			return false
		}
		if r.GetCode() != lockpb.Code_CODE_OK {
			return r.GetCode() == lockpb.Code_CODE_INVALID
		}
		select {
		case src <- fsm.LockInfo{Name: key, Holder: r.GetSession(), Token: r.GetToken(), Value: r.GetValue()}:
		case <-ctx.Done():
			return false
		}
	}
}

// pick returns the address to try: the known leader, else the current one.
func (c *Client) pick() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.pickLocked()
}

func (c *Client) pickLocked() string {
	if c.leader != "" {
		return c.leader
	}
	return c.addrs[c.current%len(c.addrs)]
}

// pickWatch is pick with the channel that closes when the client learns
// that an address other than the one picked leads: an attempt sent there
// then moves on.
func (c *Client) pickWatch() (string, <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	addr := c.pickLocked()
	return addr, c.awayLocked(addr)
}

// rewatch reports whether addr is still the address to try (a leader
// learned and then addr again) and, if so, returns its new channel.
func (c *Client) rewatch(addr string) (<-chan struct{}, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pickLocked() != addr {
		return nil, false
	}
	return c.awayLocked(addr), true
}

func (c *Client) awayLocked(addr string) chan struct{} {
	ch := c.away[addr]
	if ch == nil {
		if c.away == nil {
			c.away = make(map[string]chan struct{})
		}
		ch = make(chan struct{})
		c.away[addr] = ch
	}
	return ch
}

// rotate forgets addr as the leader and moves on to the next address.
func (c *Client) rotate(addr string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.leader == addr {
		c.leader = ""
	}
	if c.addrs[c.current%len(c.addrs)] == addr {
		c.current++
	}
}

// setLeader records addr as the leader. The attempts waiting at any other
// address end (see Client.away); those waiting at addr stay, also when
// the client had forgotten it: closing one channel for every learning of
// a leader the client had forgotten aborted every call waiting at that
// (healthy) leader, and each aborted call forgot it again, so that calls
// with short contexts kept a client's other calls bouncing off a healthy
// leader (TestReviewJShortCallsDoNotUnsettleTheLeader); and closing none
// when the leader learned again was the last one moved to left the calls
// sent elsewhere meanwhile waiting at a silent replica
// (TestReviewLForgottenLeaderLearnedAgainMovesCallsElsewhere).
func (c *Client) setLeader(addr string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if addr != "" {
		for a, ch := range c.away {
			if a != addr {
				close(ch)
				delete(c.away, a)
			}
		}
	}
	c.leader = addr
}

func (c *Client) conn(addr string) (*grpc.ClientConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cc, ok := c.cm.conns[addr]; ok {
		return cc, nil
	}
	if c.isClosed() {
		// A retry racing with Close: a connection opened now would never
		// be closed (Close marks the client closed before closeConns).
		return nil, ErrClosed
	}
	return c.cm.dial(addr, addr, dialOptions(c.opts.tls, c.opts.dialer))
}

// redial forgets cc, the connection to addr, after a heartbeat batch or
// a request attempt (attemptEnded) sent on it at sent went unanswered for
// its whole time, unless cc heard anything since (connMaps.redialSilent).
func (c *Client) redial(addr string, cc *grpc.ClientConn, sent time.Time) {
	c.cm.redialSilent(&c.mu, addr, cc, sent, c.hb.background)
}

// propStream returns the Propose stream to addr, over cc, opening one
// (for at most as long as ctx allows, and until abort closes) if there is
// none or it broke.
func (c *Client) propStream(ctx context.Context, abort <-chan struct{}, addr string, cc *grpc.ClientConn) (*propStream, error) {
	return cachedPropStream(ctx, abort, &c.mu, c.cm.ps, addr, c.cm.opens, func() (*grpc.ClientConn, error) { return cc, nil })
}

func (c *Client) closeConns() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cm.closeAll()
}

// streamWindow and connWindow are the HTTP/2 flow-control windows, in
// bytes, of every gRPC connection quorumlock opens or accepts (peers,
// forwarded requests, Clients). Static windows turn off gRPC's dynamic
// window sizing (its BDP estimator), which pings the sender after every
// data frame that arrives while no ping is out: on a lock hand-off, a
// chain of small messages one round trip apart, that is a ping and its
// ack, two more socket writes and reads, for almost every message. 4 MiB
// per stream holds a whole raft append (MaxSizePerMsg, 1 MiB by default)
// and keeps a snapshot stream at 80 MB/s over a 50 ms round trip. A
// receiver buffers at most the window of unread data per stream and
// connection; gRPC's dynamic windows grow to 16 MiB.
const (
	streamWindow = 4 << 20
	connWindow   = 8 << 20
)

// dialOptions are the options of every connection quorumlock opens to a
// replica: TLS or plaintext, the dialer, and keepalive pings that detect a
// replica that went silent (paused, or cut off without a reset). gRPC
// raises the ping interval to at least 10 s, so detection takes 10-20 s;
// requests that wait at a leader also move on as soon as the client learns
// of a new leader (Client.away).
func dialOptions(tlsCfg *tls.Config, dialer func(context.Context, string) (net.Conn, error)) []grpc.DialOption {
	creds := insecure.NewCredentials()
	if tlsCfg != nil {
		creds = credentials.NewTLS(tlsCfg)
	}
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithStaticStreamWindowSize(streamWindow),
		grpc.WithStaticConnWindowSize(connWindow),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 10 * time.Second, Timeout: 5 * time.Second, PermitWithoutStream: true}),
		// Redial a replica that failed within a fraction of a second, not
		// after gRPC's default backoff (1 s, growing to 2 min), during
		// which every RPC fails at once with the old dial error: a
		// replica that was cut off may be the next leader.
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 20 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 500 * time.Millisecond},
			MinConnectTimeout: time.Second,
		}),
	}
	if dialer != nil {
		opts = append(opts, grpc.WithContextDialer(dialer))
	}
	return opts
}

// checkAddr refuses an address that gRPC would dial on port 443 (no port)
// or fail to resolve only later. A target whose scheme gRPC resolves is
// taken as gRPC takes it ("unix:///path", "passthrough:///host:port"),
// except that a dns target must name its port as a bare address must;
// without a known scheme, gRPC resolves the address with dns.
func checkAddr(a string) error {
	endpoint := a
	if u, err := url.Parse(a); err == nil && resolver.Get(u.Scheme) != nil {
		if u.Scheme != "dns" {
			return nil
		}
		// gRPC's endpoint: the path, or the opaque part of "dns:host:port".
		endpoint = u.Path
		if endpoint == "" {
			endpoint = u.Opaque
		}
		endpoint = strings.TrimPrefix(endpoint, "/")
	}
	_, port, err := net.SplitHostPort(endpoint)
	if err == nil && port == "" {
		err = errors.New("missing port in address")
	}
	if err == nil && strings.TrimLeft(port, "-0123456789") == "" {
		// A numeric port: it must be one (a name such as "http" is left
		// to the resolver).
		if p, perr := strconv.Atoi(port); perr != nil || p < 0 || p > 65535 {
			err = fmt.Errorf("port %s is out of range", port)
		}
	}
	return err
}

// propose implements backend.
func (c *Client) propose(ctx context.Context, req *lockpb.Request) (*lockpb.Response, error) {
	resp, _, err := c.proposeTracked(ctx, req)
	return resp, err
}

// proposeTracked is propose that also reports whether an attempt before
// the answered one may have taken effect (it was sent, and failed or timed
// out before its answer came).
func (c *Client) proposeTracked(ctx context.Context, req *lockpb.Request) (resp *lockpb.Response, uncertain bool, err error) {
	blocking := req.GetOp() == lockpb.Op_OP_ACQUIRE && !req.GetTry()
	err = c.retryPropose(ctx, blocking, func(actx context.Context, moved <-chan struct{}, cc *grpc.ClientConn, addr string) (bool, error) {
		ps, err := c.propStream(actx, moved, addr, cc)
		if err != nil {
			return false, err
		}
		r, err := ps.call(actx, moved, req)
		if err != nil {
			uncertain = true
			return false, err
		}
		switch r.GetCode() {
		case lockpb.Code_CODE_NOT_LEADER:
			if a := r.GetLeaderAddr(); a != "" && a != addr {
				c.setLeader(a)
			} else {
				c.rotate(addr)
			}
			return false, nil
		case lockpb.Code_CODE_UNAVAILABLE:
			return false, nil
		}
		c.setLeader(addr)
		resp = r
		return true, nil
	})
	return resp, uncertain, err
}

// retryPropose is retry for proposals: a blocking acquire may wait at the
// leader for as long as ctx allows (a dead leader is detected by keepalive),
// other attempts are bounded by the attempt limit. An attempt ends (with
// an error) when moved closes: the heartbeats found another leader.
func (c *Client) retryPropose(ctx context.Context, blocking bool, attempt func(actx context.Context, moved <-chan struct{}, cc *grpc.ClientConn, addr string) (bool, error)) error {
	backoff := minBackoff
	hops := 0 // redirects and failovers followed at once since the last backoff
	// At most one hop per address, and a few even with fewer addresses: a
	// client given one replica learns the others from hints, and after a
	// leadership transfer the old leader names the new one while a
	// follower may still name the old one for a round trip.
	maxHops := max(len(c.addrs), 3)
	for {
		// Nothing is sent once ctx has ended: a request sent then could
		// take effect (a grant) after the caller was told ctx's error, as
		// it never does on a replica.
		if err := ctx.Err(); err != nil {
			return err
		}
		// Picked with its channel: a leader change between the two
		// would otherwise go unnoticed.
		addr, moved := c.pickWatch()
		cc, err := c.conn(addr)
		if err == nil {
			actx, cancel := ctx, func() {}
			if !blocking {
				actx, cancel = context.WithTimeout(ctx, c.opts.attemptLimit)
			}
			// A blocking acquire waits at the leader for as long as it
			// takes; if the heartbeats find another leader meanwhile
			// (moved), it is re-sent there (same session and seq: the new
			// leader's table answers with its current outcome).
			sent := time.Now()
			var final bool
			final, err = attempt(actx, moved, cc, addr)
			c.cm.attemptEnded(&c.mu, c.hb, ctx, actx, addr, cc, sent)
			cancel()
			if final {
				return err
			}
			if err == nil {
				// Redirected: try the hint (or, without one, the next
				// replica) at once, but not forever: a stale hint naming
				// a replica that names no leader (a deposed leader before
				// the majority elects another) or replicas that all name
				// none (an election) would bounce the request between
				// them a round trip apart. Past one hop per address, wait
				// as after a failure.
				if c.pick() != addr && hops < maxHops {
					hops++
					continue
				}
			} else if ctx.Err() == nil || !blocking {
				// The replica failed, or did not answer a request it
				// answers at once (all but a queued acquire) before the
				// caller's ctx ended: a silent replica (paused, black-
				// holed) is otherwise noticed only by keepalive, 10-20 s
				// later, and calls shorter than the attempt limit would
				// all wait at it meanwhile. A blocking acquire whose ctx
				// ended while it waited in the queue says nothing about
				// the leader: it is kept.
				c.rotate(addr)
				// Another replica to try (the failed one was not the
				// only address): at once, within the hop budget, as a
				// leader that stopped after handing over leadership
				// closes the requests it had.
				if ctx.Err() == nil && c.pick() != addr && hops < maxHops {
					hops++
					continue
				}
			}
		} else {
			c.rotate(addr)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return ctx.Err()
		}
		hops = 0
		backoff = min(backoff*2, backoffCap(c.opts.settle))
	}
}

// keepAlive implements backend: one batch to the leader (or the replica
// tried first), over the shared stream.
func (c *Client) keepAlive(ctx context.Context, ids []uint64) (alive, gone []uint64, err error) {
	addr := c.pick()
	for range 2 {
		cc, err := c.conn(addr)
		if err != nil {
			c.rotate(addr)
			return nil, nil, err
		}
		c.mu.Lock()
		s := c.cm.ka[addr]
		if s == nil || s.broken() {
			s = newKAStream(cc)
			c.cm.ka[addr] = s
		}
		c.mu.Unlock()
		sent := time.Now()
		resp, err := s.send(ctx, ids)
		if err != nil {
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				// No answer in the batch's whole time: the replica is
				// silent, or the connection is dead without a reset.
				c.redial(addr, cc, sent)
			}
			c.rotate(addr)
			return nil, nil, err
		}
		if resp.GetCode() == lockpb.Code_CODE_OK {
			c.setLeader(addr)
			return resp.GetAlive(), resp.GetExpired(), nil
		}
		if a := resp.GetLeaderAddr(); a != "" && a != addr {
			c.setLeader(a)
			addr = a
			continue
		}
		c.rotate(addr)
		return nil, nil, errNoLeader
	}
	return nil, nil, errNoLeader
}

// settleGrace implements backend.
func (c *Client) settleGrace() time.Duration { return c.opts.settle }
