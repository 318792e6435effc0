package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func ms3(vs ...float64) []*measure {
	out := make([]*measure, len(vs))
	for i, v := range vs {
		if !math.IsNaN(v) {
			out[i] = &measure{value: v, extra: map[string]any{"round": i}}
		}
	}
	return out
}

// TestRowFinishTakesMedians: with several rounds the table's value is each
// system's median round (failed rounds left out), the ratio is of the
// medians, and the fsync probe is the median of its rounds.
func TestRowFinishTakesMedians(t *testing.T) {
	nan := math.NaN()
	boom := errors.New("boom")
	r := &row{sc: scenario{name: "handoff_16"}}
	for i, v := range []float64{900, 1500, 1100} {
		r.add("ours", &measure{value: v, extra: map[string]any{"round": i}}, nil)
	}
	r.add("etcd", &measure{value: 160}, nil)
	r.add("etcd", nil, boom)
	r.add("etcd", &measure{value: 150}, nil)
	r.addFsync(0.3, 0.9)
	r.addFsync(0.2, 0.5)
	r.addFsync(0.4, 0.7)
	r.finish()
	if r.ours == nil || r.ours.value != 1100 || r.ours.extra["round"] != 2 {
		t.Fatalf("ours median = %+v, want round 2 (1100)", r.ours)
	}
	if r.oursErr != nil || r.etcdErr != nil {
		t.Fatalf("errors %v, %v: a failed round must not fail the row when others succeeded", r.oursErr, r.etcdErr)
	}
	if r.etcd == nil || r.etcd.value != 155 {
		t.Fatalf("etcd median of two rounds = %+v, want the mean 155", r.etcd)
	}
	if x, ok := r.ratio(); !ok || math.Abs(x-1100.0/155) > 1e-9 {
		t.Fatalf("ratio = %v, %v; want ratio of medians %v", x, ok, 1100.0/155)
	}
	if r.fsyncP50 != 0.3 || r.fsyncP99 != 0.7 {
		t.Fatalf("fsync p50, p99 = %v, %v; want medians 0.3, 0.7", r.fsyncP50, r.fsyncP99)
	}
	rep := &report{rows: []*row{r}}
	if n := rep.failedRounds(); n != 1 {
		t.Fatalf("failedRounds = %d, want 1 (etcd's second round); a failed round must make the run exit non-zero", n)
	}
	got := r.roundRatios()
	if len(got) != 3 || got[0] != 900.0/160 || !math.IsNaN(got[1]) || got[2] != 1100.0/150 {
		t.Fatalf("round ratios = %v, want [%v NaN %v]", got, 900.0/160, 1100.0/150)
	}
	notes := strings.Join(r.notes(), "\n")
	for _, want := range []string{"ours [900.0 1500 1100]", "etcd [160.0 - 150.0]", "ratio per round [5.62x - 7.33x]", "etcd failed in 1 of 3 rounds", "boom"} {
		if !strings.Contains(notes, want) {
			t.Errorf("notes lack %q:\n%s", want, notes)
		}
	}

	// Every round failed: the first error is the row's.
	all := &row{sc: scenario{name: "x"}}
	all.add("ours", nil, boom)
	all.add("ours", nil, errors.New("second"))
	all.finish()
	if all.ours != nil || all.oursErr != boom {
		t.Fatalf("all rounds failed: ours %+v, err %v; want nil, boom", all.ours, all.oursErr)
	}
	if all.etcd != nil || all.etcdErr != nil {
		t.Fatalf("a system that did not run: %+v, %v; want nil, nil", all.etcd, all.etcdErr)
	}

	// The median leaves its input in round order.
	in := ms3(3, nan, 1, 2)
	if m := median(in); m == nil || m.value != 2 {
		t.Fatalf("median = %+v, want 2", m)
	}
	if in[0].value != 3 || in[1] != nil || in[2].value != 1 {
		t.Fatal("median reordered its input")
	}
	if m := median(ms3(nan)); m != nil {
		t.Fatalf("median of failed rounds = %+v, want nil", m)
	}
	// An even count's copy does not share the extras of the round it came from.
	even := ms3(1, 3)
	m := median(even)
	m.extra["round"] = 9
	if m.value != 2 || even[0].extra["round"] != 0 {
		t.Fatalf("even median = %+v, source extras %v", m, even[0].extra)
	}
}

// TestReportJSONRounds: with -rounds the JSON keeps every round (null where
// one failed) next to the medians; with one round it has no round lists.
func TestReportJSONRounds(t *testing.T) {
	dir := t.TempDir()
	for _, rounds := range []int{1, 3} {
		p := &params{rounds: rounds}
		r := &row{sc: scenario{name: "uncontended_64", unit: "cycles/s", judge: func(*row) string { return "-" }}}
		for i := range rounds {
			r.add("ours", &measure{value: float64(100 * (i + 1)), extra: map[string]any{}}, nil)
			if i == 1 {
				r.add("etcd", nil, errors.New("down"))
			} else {
				r.add("etcd", &measure{value: 10, extra: map[string]any{}}, nil)
			}
		}
		r.finish()
		rep := &report{params: p, start: time.Now(), end: time.Now(), rows: []*row{r}}
		path := filepath.Join(dir, "out.json")
		if err := rep.writeJSON(path); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var out struct {
			Scenarios map[string]map[string]any `json:"scenarios"`
		}
		if err := json.Unmarshal(b, &out); err != nil {
			t.Fatal(err)
		}
		e := out.Scenarios["uncontended_64"]
		var buf bytes.Buffer
		rep.print(&buf)
		if rounds == 1 {
			if e["ours"] != 100.0 || e["ratio"] != 10.0 || e["ours_rounds"] != nil {
				t.Fatalf("one round: %v", e)
			}
			if strings.Contains(buf.String(), "ROUNDS") {
				t.Fatalf("one round printed a rounds header:\n%s", buf.String())
			}
			continue
		}
		if e["ours"] != 200.0 || e["etcd"] != 10.0 || e["ratio"] != 20.0 {
			t.Fatalf("medians: ours %v, etcd %v, ratio %v; want 200, 10, 20", e["ours"], e["etcd"], e["ratio"])
		}
		or, _ := json.Marshal(e["ours_rounds"])
		er, _ := json.Marshal(e["etcd_rounds"])
		rr, _ := json.Marshal(e["ratio_rounds"])
		if string(or) != "[100,200,300]" || string(er) != "[10,null,10]" || string(rr) != "[10,null,30]" {
			t.Fatalf("round lists: ours %s, etcd %s, ratio %s", or, er, rr)
		}
		if !strings.Contains(buf.String(), "ROUNDS: every scenario ran 3 times") {
			t.Fatalf("no rounds header:\n%s", buf.String())
		}
	}
}
