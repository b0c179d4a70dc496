package mjenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// AssetsEnvVar names the environment variable that, when set, is the
// directory holding Gymnasium's MuJoCo robot XMLs (half_cheetah.xml,
// hopper.xml, ...). Without it the directory is found by asking python3
// where the installed gymnasium package lives.
const AssetsEnvVar = "RLHUB_MUJOCO_ASSETS"

// assetsHint says how to provide the robot models.
const assetsHint = "install Gymnasium for its robot models (python3 -m pip install 'gymnasium[mujoco]') " +
	"or set " + AssetsEnvVar + " to a directory holding its envs/mujoco/assets XML files"

var gymAssets struct {
	once sync.Once
	dir  string
	err  error
}

// AssetsDir returns the directory of Gymnasium's MuJoCo XMLs: $RLHUB_MUJOCO_ASSETS
// when set, else gymnasium/envs/mujoco/assets of the gymnasium package that
// python3 imports (looked up once per process).
func AssetsDir() (string, error) {
	if dir := os.Getenv(AssetsEnvVar); dir != "" {
		if st, err := os.Stat(dir); err != nil || !st.IsDir() {
			return "", fmt.Errorf("mjenv: %s=%q is not a directory: %s", AssetsEnvVar, dir, assetsHint)
		}
		return dir, nil
	}
	gymAssets.once.Do(func() { gymAssets.dir, gymAssets.err = findGymnasiumAssets() })
	return gymAssets.dir, gymAssets.err
}

func findGymnasiumAssets() (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "python3", "-c", "import gymnasium, os; print(os.path.dirname(gymnasium.__file__))")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		msg := strings.TrimSpace(stderr.String())
		if i := strings.LastIndexByte(msg, '\n'); i >= 0 {
			msg = msg[i+1:] // the exception line of a traceback
		}
		return "", fmt.Errorf("mjenv: cannot locate the gymnasium package (%v: %s): %s", err, msg, assetsHint)
	}
	dir := filepath.Join(strings.TrimSpace(string(out)), "envs", "mujoco", "assets")
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return "", fmt.Errorf("mjenv: gymnasium has no %s: %s", dir, assetsHint)
	}
	return dir, nil
}

// modelPath resolves one XML file inside dir (AssetsDir when dir is empty).
func modelPath(dir, file string) (string, error) {
	if dir == "" {
		var err error
		if dir, err = AssetsDir(); err != nil {
			return "", err
		}
	}
	p := filepath.Join(dir, file)
	if _, err := os.Stat(p); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return "", fmt.Errorf("mjenv: robot model %s not found: %s", p, assetsHint)
		}
		return "", fmt.Errorf("mjenv: robot model: %w", err)
	}
	return p, nil
}
