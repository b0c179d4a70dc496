package ars

import "testing"

// TestPaperDefaults: every paper task has valid hyperparameters, and its
// defaults are the paper's with the Table 1 threshold as the target.
func TestPaperDefaults(t *testing.T) {
	for _, name := range PaperTasks {
		p, ok := PaperFor(name)
		if !ok {
			t.Fatalf("%s: not in the paper table", name)
		}
		h := p.Hyper
		if err := h.Validate(); err != nil {
			t.Errorf("%s: %v", name, err)
		}
		d := EnvDefaults(name)
		if d.Hyper != p.Hyper || !d.HasTarget || d.Target != p.Threshold || d.MaxEpisodes != 10*p.Episodes || d.EvalEvery < 1 {
			t.Errorf("%s: defaults %+v, paper %+v", name, d, p)
		}
	}
	if p, _ := PaperFor("Swimmer-v5"); p.Hyper.Version != V1 || p.Threshold != 325 || p.Episodes != 100 {
		t.Errorf("Swimmer-v5: %+v, want V1, 325, 100", p)
	}
	if _, ok := PaperFor("CartPole-v1"); ok {
		t.Error("CartPole-v1 is not a paper task")
	}
}
