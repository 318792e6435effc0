package lockpb

import "google.golang.org/protobuf/proto"

// MaxBatchBytes bounds one ProposeCalls or ProposeReplies message, well
// under gRPC's default 4 MiB receive limit (a request may carry a 4 KiB
// value).
const MaxBatchBytes = 1 << 20

// BatchLen returns how many leading messages of msgs fit in MaxBatchBytes
// together: at least one, when msgs is not empty.
func BatchLen[M proto.Message](msgs []M) int {
	total := 0
	for i, m := range msgs {
		total += proto.Size(m)
		if i > 0 && total > MaxBatchBytes {
			return i
		}
	}
	return len(msgs)
}
