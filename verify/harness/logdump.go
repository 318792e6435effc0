package harness

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/quorumlock/quorumlock/internal/fsm"
	"github.com/quorumlock/quorumlock/storage/pebblestore"
)

// dumpLogs writes the raft log of every replica data directory under work
// (after the cluster stopped) as text to out, one entry a line with its
// decoded command: the ground truth for diagnosing a violation.
func dumpLogs(work, out string) error {
	dirs, _ := filepath.Glob(filepath.Join(work, "tmp*", "r*", "log"))     // testcluster
	more, _ := filepath.Glob(filepath.Join(work, "tmp*", "data-*", "log")) // proctest (lockd)
	dirs = append(dirs, more...)
	var b strings.Builder
	for _, dir := range dirs {
		st, err := pebblestore.Open(dir, pebblestore.Options{})
		if err != nil {
			fmt.Fprintf(&b, "# %s: %v\n", dir, err)
			continue
		}
		first, _ := st.FirstIndex()
		last, _ := st.LastIndex()
		fmt.Fprintf(&b, "# %s: entries %d..%d\n", dir, first, last)
		if last >= first {
			ents, err := st.Entries(first, last+1, 1<<40)
			if err != nil {
				fmt.Fprintf(&b, "# %v\n", err)
			}
			for _, e := range ents {
				var cmd fsm.Command
				desc := "(empty)"
				if len(e.GetData()) > 0 {
					if err := fsm.Decode(e.GetData(), &cmd); err != nil {
						desc = "undecodable: " + err.Error()
					} else {
						desc = fmt.Sprintf("%+v", cmd)
					}
				}
				fmt.Fprintf(&b, "%d t%d %s\n", e.GetIndex(), e.GetTerm(), desc)
			}
		}
		st.Close()
	}
	return os.WriteFile(out, []byte(b.String()), 0o644)
}
