package run

import (
	"fmt"
	"io"
	"math"

	"github.com/schollz/progressbar/v3"
)

// progress draws a run's progress: on a terminal one bar redrawn in
// place, elsewhere (a log file, CI) one line per iteration.
type progress struct {
	w        io.Writer
	bar      *progressbar.ProgressBar
	total    int64
	protocol string
	lastEval float64
}

func newProgress(w io.Writer, terminal bool, total int64, protocol string) *progress {
	p := &progress{w: w, total: total, protocol: protocol, lastEval: math.NaN()}
	if w != nil && terminal {
		p.bar = progressbar.NewOptions64(total,
			progressbar.OptionSetWriter(w),
			progressbar.OptionSetDescription("ars"),
			progressbar.OptionShowCount(),
			progressbar.OptionSetItsString("episodes"),
			progressbar.OptionThrottle(0),
			progressbar.OptionSetWidth(20),
		)
	}
	return p
}

// line is the text of one iteration, shared by the bar and the lines.
func (p *progress) line(it Iteration) string {
	eval := fmt.Sprintf("eval %.1f", p.lastEval)
	if it.HasEval {
		eval = fmt.Sprintf("eval %.1f ± %.1f", it.EvalReturn, it.EvalStd)
		if it.Confirm {
			eval = fmt.Sprintf("re-evaluation on fresh episodes %.1f ± %.1f", it.EvalReturn, it.EvalStd)
		}
	}
	train := ""
	if it.HasTrain {
		train = fmt.Sprintf(" | train %.1f", it.TrainReturn)
	}
	return fmt.Sprintf("it %d | ep %d | %.0f steps/s%s | %s (%s protocol)", it.Iteration, it.Episodes, it.StepsPerSecond, train, eval, p.protocol)
}

func (p *progress) update(it Iteration) {
	if p.w == nil {
		return
	}
	s := p.line(it)
	if it.HasEval && !it.Confirm {
		p.lastEval = it.EvalReturn
	}
	if p.bar == nil {
		fmt.Fprintf(p.w, "ars %s\n", s)
		return
	}
	p.bar.Describe(s)
	if p.total > 0 {
		p.bar.Set64(min(it.Episodes, p.total))
	} else {
		p.bar.Set64(it.Episodes)
	}
}

func (p *progress) finish() {
	if p.bar != nil {
		p.bar.Exit()
		fmt.Fprintln(p.w)
	}
}
