package quorumlock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/raft/v3"

	"github.com/quorumlock/quorumlock/internal/lockpb"
	"github.com/quorumlock/quorumlock/internal/service"
	"github.com/quorumlock/quorumlock/raftnode"
)

// nodeMetrics are one replica's Prometheus metrics, registered with
// Config.Metrics under the constant label member="<ID>" (so several replicas
// may share a registry) and unregistered by Close. A nil *nodeMetrics (no
// registry configured) records nothing.
type nodeMetrics struct {
	reg        prometheus.Registerer
	collectors []prometheus.Collector

	requests     *prometheus.CounterVec
	requestTime  *prometheus.HistogramVec
	heartbeats   *prometheus.CounterVec
	expired      prometheus.Counter
	saveTime     prometheus.Histogram
	savedEntries prometheus.Counter
	snapshots    prometheus.Counter
	snapshotSize prometheus.Gauge

	// byRequest caches the request metrics of each (op, result) seen, so
	// that a request costs no label formatting or vector lookup.
	byRequest sync.Map // requestKey -> *requestMetrics
}

// requestKey is a request's op and result: a lockpb.Code, or one of
// resultCanceled and resultError.
type requestKey struct{ op, result int32 }

const (
	resultCanceled int32 = -1
	resultError    int32 = -2
)

type requestMetrics struct {
	count prometheus.Counter
	time  prometheus.Observer
}

func (m *nodeMetrics) request(k requestKey) *requestMetrics {
	if r, ok := m.byRequest.Load(k); ok {
		return r.(*requestMetrics)
	}
	code := "canceled"
	switch {
	case k.result == resultError:
		code = "error"
	case k.result >= 0:
		code = codeLabel(lockpb.Code(k.result))
	}
	name := opLabel(lockpb.Op(k.op))
	r, _ := m.byRequest.LoadOrStore(k, &requestMetrics{
		count: m.requests.WithLabelValues(name, code),
		time:  m.requestTime.WithLabelValues(name),
	})
	return r.(*requestMetrics)
}

// latencyBuckets run from 100 us to about 3.3 s.
var latencyBuckets = prometheus.ExponentialBuckets(100e-6, 2, 16)

// newNodeMetrics creates n's metrics for reg (nil: none); register adds
// them once n's raft node and service exist: the gauges read n's raft
// status and lock table when scraped.
func newNodeMetrics(reg prometheus.Registerer, n *Node) *nodeMetrics {
	if reg == nil {
		return nil
	}
	labels := prometheus.Labels{"member": strconv.FormatUint(n.cfg.ID, 10)}
	opts := func(name, help string) prometheus.Opts {
		return prometheus.Opts{Namespace: "quorumlock", Name: name, Help: help, ConstLabels: labels}
	}
	hist := func(name, help string) prometheus.HistogramOpts {
		return prometheus.HistogramOpts{Namespace: "quorumlock", Name: name, Help: help, ConstLabels: labels, Buckets: latencyBuckets}
	}
	m := &nodeMetrics{
		reg:          reg,
		requests:     prometheus.NewCounterVec(prometheus.CounterOpts(opts("requests_total", "Session requests (open, acquire, release, withdraw, close, proclaim, revoke; unknown: an op the protocol does not name) this replica served as the leader or refused, by op and result code (canceled: the caller's context ended).")), []string{"op", "code"}),
		requestTime:  prometheus.NewHistogramVec(hist("request_seconds", "Time from a session request's arrival to its answer at this replica (a blocking acquire includes its wait in the queue), by op."), []string{"op"}),
		heartbeats:   prometheus.NewCounterVec(prometheus.CounterOpts(opts("heartbeats_total", "Session heartbeats this replica answered as the leader, by result (alive: acknowledged after a leadership confirmation; gone: the session had ended).")), []string{"result"}),
		expired:      prometheus.NewCounter(prometheus.CounterOpts(opts("expired_sessions_total", "Sessions this replica, as the leader, proposed to expire (TTL passed without a heartbeat)."))),
		saveTime:     prometheus.NewHistogram(hist("log_save_seconds", "Time of one synced log write: a raft Ready's new entries and hard state (a hard state that only moves the commit index is not written).")),
		savedEntries: prometheus.NewCounter(prometheus.CounterOpts(opts("log_saved_entries_total", "Raft log entries written."))),
		snapshots:    prometheus.NewCounter(prometheus.CounterOpts(opts("snapshots_total", "Snapshots of the lock table this replica took and saved."))),
		snapshotSize: prometheus.NewGauge(prometheus.GaugeOpts(opts("snapshot_bytes", "Size of the latest snapshot this replica took."))),
	}
	status := func(f func(st raftnode.Status) float64) func() float64 {
		return func() float64 { return f(n.raft.Status()) }
	}
	counts := func(f func(sessions, locks int) float64) func() float64 {
		return func() float64 { return f(n.svc.Counts()) }
	}
	m.collectors = []prometheus.Collector{
		m.requests, m.requestTime, m.heartbeats, m.expired, m.saveTime, m.savedEntries, m.snapshots, m.snapshotSize,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts(opts("raft_term", "Current raft term.")), status(func(st raftnode.Status) float64 { return float64(st.Term) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts(opts("raft_leader", "1 if this replica is the raft leader, else 0.")), status(func(st raftnode.Status) float64 {
			if st.State == raft.StateLeader {
				return 1
			}
			return 0
		})),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts(opts("raft_commit_index", "Highest log index known committed.")), status(func(st raftnode.Status) float64 { return float64(st.Commit) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts(opts("raft_applied_index", "Highest log index applied to the lock table.")), status(func(st raftnode.Status) float64 { return float64(st.Applied) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts(opts("sessions", "Live sessions in this replica's lock table.")), counts(func(s, _ int) float64 { return float64(s) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts(opts("locks_held", "Held locks (roles included) in this replica's lock table.")), counts(func(_, l int) float64 { return float64(l) })),
	}
	return m
}

// register adds every metric to the registry, or none.
func (m *nodeMetrics) register() error {
	if m == nil {
		return nil
	}
	for i, c := range m.collectors {
		if err := m.reg.Register(c); err != nil {
			for _, done := range m.collectors[:i] {
				m.reg.Unregister(done)
			}
			return fmt.Errorf("%w: Metrics: registering: %w", ErrInvalidConfig, err)
		}
	}
	return nil
}

// unregister removes every metric from the registry.
func (m *nodeMetrics) unregister() {
	if m == nil {
		return
	}
	for _, c := range m.collectors {
		m.reg.Unregister(c)
	}
}

// serviceHooks are the service's hooks into m (none when m is nil).
func (m *nodeMetrics) serviceHooks() service.Hooks {
	if m == nil {
		return service.Hooks{}
	}
	return service.Hooks{
		Request: func(op lockpb.Op, resp *lockpb.Response, err error, d time.Duration) {
			// An op no client should send (any int32 a peer may put on
			// the wire) counts under one label: a label per value would
			// let one client grow the registry, and the leader's
			// memory, without bound.
			if _, known := lockpb.Op_name[int32(op)]; !known {
				op = opUnknown
			}
			k := requestKey{op: int32(op), result: resultCanceled}
			if err == nil {
				k.result = int32(resp.GetCode())
			} else if !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
				k.result = resultError
			}
			r := m.request(k)
			r.count.Inc()
			r.time.Observe(d.Seconds())
		},
		Heartbeats: func(alive, gone int) {
			m.heartbeats.WithLabelValues("alive").Add(float64(alive))
			m.heartbeats.WithLabelValues("gone").Add(float64(gone))
		},
		Expired: func(n int) { m.expired.Add(float64(n)) },
	}
}

// onSave and onSnapshot are raftnode's hooks (nil when m is nil).
func (m *nodeMetrics) onSave() func(time.Duration, int) {
	if m == nil {
		return nil
	}
	return func(d time.Duration, entries int) {
		m.saveTime.Observe(d.Seconds())
		m.savedEntries.Add(float64(entries))
	}
}

func (m *nodeMetrics) onSnapshot() func(int) {
	if m == nil {
		return nil
	}
	return func(bytes int) {
		m.snapshots.Inc()
		m.snapshotSize.Set(float64(bytes))
	}
}

// opLabel and codeLabel are the lower-case names without the enum prefix:
// OP_ACQUIRE -> acquire, CODE_NOT_LEADER -> not_leader.
// opUnknown stands for every op value lockpb does not name (see
// serviceHooks); it is labelled "unknown".
const opUnknown lockpb.Op = -1

func opLabel(op lockpb.Op) string {
	if op == opUnknown {
		return "unknown"
	}
	return lower(op.String(), "OP_")
}

func codeLabel(c lockpb.Code) string {
	return lower(c.String(), "CODE_")
}

func lower(s, prefix string) string {
	return strings.ToLower(strings.TrimPrefix(s, prefix))
}
