package ingress

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/ingress/decide"
)

// HeaderWaited is the response header of a request that passed a wait rule
// (on_limit: wait): the seconds it was held for its paced slot, to the millisecond
// ("0.84"; "0" when its slot was free). It is the wait the store computed when the
// slot was reserved, not a measurement.
const HeaderWaited = "Sluice-Waited"

// formatWaited writes d in seconds to the millisecond, as HeaderWaited carries it.
func formatWaited(d time.Duration) string {
	return strconv.FormatFloat(float64(d.Round(time.Millisecond).Milliseconds())/1000, 'f', -1, 64)
}

// answerWait answers a check (Authorize) whose request a wait rule would hold for
// wait: a check cannot hold the request it is asked about (the proxy's own timeout
// would pass first), so it gives the slots back and answers 429 with Retry-After the
// wait, rounded up to whole seconds: when the client's slot would have come.
func (m *Middleware) answerWait(ctx context.Context, w http.ResponseWriter, v *decide.Verdict) {
	names := v.Held()
	m.engine.Refuse(ctx, v)
	decide.SetRetryAfter(w.Header(), v.Wait)
	writeProblem(w, quotaExceeded(names, v.Closest.Limit, v.Wait))
}
